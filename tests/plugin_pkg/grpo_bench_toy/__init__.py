"""Toy extensions of the harness, one file per recipe of CONTRIBUTING.md (each file is also copied into a
copy of the repository by tests/test_extension_recipes.py, as a contributor would add it)."""
