# Loads the autograder's pytest options (--impl) and fixtures for every way of calling
# pytest (`pytest`, `pytest tests/test_a03_fused_linear.py`, `pytest --impl solutions`).
pytest_plugins = ["tests.autograder"]
