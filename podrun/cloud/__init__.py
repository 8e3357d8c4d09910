"""The Cloud TPU side: gcloud's settings (settings.py), the v2 API (tpu_api.py, the only module
that imports Google's client; what it answers in tpu_resources.py, its credentials in google_credentials.py,
its failures in api_errors.py), the accelerator types (accelerators.py), what podrun asks Google for
(request.py), the capacity got and given back (capacity.py), and gcloud's create flags that podrun
names its own way (gcloud_flags.py)."""
