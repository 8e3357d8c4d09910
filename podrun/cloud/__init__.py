"""The Cloud TPU side: gcloud's settings (settings.py), the v2 API (tpu_api.py, the only module
that imports Google's client; what it answers in tpu_resources.py, its credentials in google_credentials.py,
its failures in api_errors.py), the accelerator types (accelerators.py), what podrun asks Google for
(request.py), the capacity got and given back (capacity.py), and gcloud's create flags that podrun
names its own way (gcloud_flags.py)."""

from podrun.third_party import ignore_warnings_of

# Every import of Google's libraries is in this package. google.api_core warns at each import on a Python
# that Google's releases no longer serve (3.10 from 2026-10-11; 3.11 from 2027-07), and google.auth when
# gcloud's user credentials have no quota project: podrun names what goes wrong with credentials itself.
ignore_warnings_of("google.api_core", FutureWarning)
ignore_warnings_of("google.auth", UserWarning)
