"""The supervisor host: the podrun that runs a handed-over job there.

wheel.py: this podrun as a wheel, built from its own files and kept under PODRUN_HOME.
install.py: the podrun to run on the supervisor host, installed into its ~/.podrun/venv where it has none.
"""
