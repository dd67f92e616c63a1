"""The plan: every per-node setting, host step and container of one deployment, derived once
from the typed config as pure specs. The components turn them into resources."""
