"""Shared test helpers (models, kits, artifact checks), imported as `support.<module>`: pytest
puts tests/ on sys.path (tests/conftest.py lives there), so every test folder can import them."""
