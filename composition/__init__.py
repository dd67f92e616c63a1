"""The composition: one deployment wired from the components (composition/deployment.py), above
them, so that no package imports one that imports it (stacks -> components -> composition)."""
