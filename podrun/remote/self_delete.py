"""Placeholder until the idle branch lands: the TPU deleted with the VM's own credentials."""


def delete(config):
    return "not deleted: this podrun cannot delete a TPU from its worker yet"
