"""The inference core: models, batching, the engine, stream stores and admission.

Plain Python: nothing here imports Django or the apps (an import-linter contract in
pyproject.toml checks it), so the core runs and is tested without a project around it.
"""
