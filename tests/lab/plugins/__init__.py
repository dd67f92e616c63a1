"""Plugins the real Pulumi engine loads in the lab where the Go module proxy serves no real one.

The real CLI and engine (scripts/build-pulumi.sh) run the program; what the proxy refuses is
played here, each behind the same gRPC interface the real plugin serves (docs/testing.md, "The
real Pulumi"):

- `language.py`, as `pulumi-language-python`: the Python SDK's own language runtime server (the
  one the Automation API runs inline programs with) running the project's `__main__.py`.
- `providers.py`, as `pulumi-resource-command` and `pulumi-resource-docker`: each resource's
  create, read, update and delete performed over SSH with OpenSSH and the remote docker CLI
  (tests/lab/realmocks.py), each diff classified by the providers' own rules
  (tests/engine/diff.py) and each refresh read as pulumi-docker reads a container
  (tests/engine/container_read.py). Planning, ordering, state, secrets and outputs are the
  engine's.

`bin/` holds the executables the engine finds on PATH (ambient plugins).
"""
