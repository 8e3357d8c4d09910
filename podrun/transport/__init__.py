"""Transports: how a command reaches one worker (base.py: the interface, the worker-side script
bootstrap), over SSH (ssh.py) or as a local process tree (local.py)."""
