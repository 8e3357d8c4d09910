"""The Cloud TPU side: gcloud's settings (settings.py), the v2 API (tpu_api.py, the only module
that imports Google's client) and the accelerator types (accelerators.py)."""
