"""The kinds of target as the spec declares them, apart from how a job runs on them (targets/): each
kind's options model and what it declares (kind.py, one module per kind), and the registry of kinds."""
