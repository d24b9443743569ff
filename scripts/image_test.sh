#!/usr/bin/env bash
# The CPU image, built and tried as an operator would (docs/deployment.md: The image, tried):
#   1. builds the Dockerfile with torch from a CPU index (TORCH_INDEX, else a local one that
#      `python -m http.server` serves from a CPU wheel: TORCH_WHEEL, /opt/wheels or pip's cache);
#   2. starts it with the model volume mounted and times /readyz to 200;
#   3. checks it runs as a non-root user, streams one API answer with curl, and waits for the
#      HEALTHCHECK to say healthy;
#   4. `docker stop` while a 32-token answer streams: it ends whole and the exit status is 0;
#   5. a second start on the same volume converts nothing and is ready sooner;
#   6. prints the image's size;
#   7. runs scripts/compose_test.sh: docker-compose.yml's services with this image.
# Skips (exit 0) where no Docker engine answers. Containers use the host's network (the
# engine on the development machines has no bridge: ../shared/tools/docker-engine).
#   scripts/image_test.sh              # `make image-test`
#   IMAGE_TEST_BUILD=0 scripts/image_test.sh   # try the image built before
#   IMAGE_TEST_CONTEXT=DIR scripts/image_test.sh   # build DIR, e.g. a clean `git archive`
#                                                  # export, instead of this checkout
set -euo pipefail
cd "$(dirname "$0")/.."

image=${IMAGE:-chatsite:image-test}
port=${IMAGE_TEST_PORT:-8091}
name=chatsite-image-test
volume=chatsite-image-test-data
secret=image-test-secret-key-not-for-production-use-0123456789abcdef
admin_password=image-test-$RANDOM$RANDOM
say() { echo "image-test: $*"; }
fail() { echo "image-test: FAILED: $*" >&2; exit 1; }

if ! docker info >/dev/null 2>&1; then
  say "SKIPPED: no Docker engine answers here (docker info failed)."
  say "On a development machine, ../shared/tools/docker-engine starts one (as root)."
  exit 0
fi

index_pid=
work=$(mktemp -d)
cleanup() {
  docker rm -f "$name" >/dev/null 2>&1 || true
  docker volume rm -f "$volume" >/dev/null 2>&1 || true
  [ -z "$index_pid" ] || kill "$index_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# 1. The build.
if [ "${IMAGE_TEST_BUILD:-1}" = 1 ]; then
  torch_index=${TORCH_INDEX:-}
  if [ -z "$torch_index" ]; then
    wheel=${TORCH_WHEEL:-$(ls /opt/wheels/torch-*+cpu-cp311-*.whl 2>/dev/null | head -n1 || true)}
    [ -n "$wheel" ] || wheel=$(python3 -m pip cache list 'torch-*+cpu*' --format abspath 2>/dev/null | head -n1 || true)
    [ -n "$wheel" ] || fail "no CPU torch wheel: set TORCH_WHEEL=path/to/torch-…+cpu-cp311-….whl or TORCH_INDEX"
    # A PEP 503 index of one project: http.server lists torch/ and the wheel in it.
    mkdir "$work/index" "$work/index/torch"
    ln -s "$(realpath "$wheel")" "$work/index/torch/$(basename "$wheel")"
    # A fixed port where it is free: TORCH_INDEX is part of the build's cache key, so the
    # same URL lets a second build reuse the installed packages' layers.
    index_port=${IMAGE_TEST_INDEX_PORT:-8939}
    if curl -s -o /dev/null "http://127.0.0.1:$index_port/"; then
      index_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    fi
    python3 -m http.server --bind 127.0.0.1 --directory "$work/index" "$index_port" >/dev/null 2>&1 &
    index_pid=$!
    torch_index=http://127.0.0.1:$index_port/
    say "torch from $(basename "$wheel"), served at $torch_index"
  fi
  started=$SECONDS
  docker build --network host --build-arg TORCH_INDEX="$torch_index" -t "$image" "${IMAGE_TEST_CONTEXT:-.}" \
    >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; fail "docker build"; }
  say "built $image in $((SECONDS - started)) s"
fi
docker image inspect "$image" >/dev/null 2>&1 || fail "no image $image (IMAGE_TEST_BUILD=0 needs one built before)"
size=$(docker image inspect --format '{{.Size}}' "$image")

# 2. Start with the model volume, time /readyz.
run() {
  docker run -d --name "$name" --network host -v "$volume:/data" -e PORT="$port" \
    -e DJANGO_SECRET_KEY="$secret" -e DJANGO_SUPERUSER_USERNAME=admin \
    -e DJANGO_SUPERUSER_PASSWORD="$admin_password" "$image" >/dev/null
}
ready_within() {  # seconds from now until /readyz answers 200, at most $1
  local started=$SECONDS
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")" = 200 ]; do
    [ "$(docker inspect --format '{{.State.Running}}' "$name")" = true ] \
      || { docker logs "$name" 2>&1 | tail -30 >&2; fail "the container exited"; }
    [ $((SECONDS - started)) -lt "$1" ] || { docker logs "$name" 2>&1 | tail -30 >&2; fail "/readyz not 200 in $1 s"; }
    sleep 1
  done
  echo $((SECONDS - started))
}
docker rm -f "$name" >/dev/null 2>&1 || true
docker volume rm -f "$volume" >/dev/null 2>&1 || true
run
first_ready=$(ready_within 300)
say "first start (migrate, model conversion into the volume): /readyz 200 after $first_ready s"
# The log into a file first: `grep -q` leaving a pipe early would fail it (pipefail).
docker logs "$name" >"$work/first.log" 2>&1
grep -q "Converting" "$work/first.log" || fail "the first start did not convert the model"

# 3. Non-root; one API stream; the HEALTHCHECK.
uid=$(docker exec "$name" id -u)
[ "$uid" != 0 ] || fail "the server runs as root"
say "runs as uid $uid ($(docker exec "$name" id -un))"
key=$(docker exec "$name" python manage.py create_api_key admin --name image-test 2>/dev/null)
stream() {  # an API stream of up to $1 tokens into $2
  curl -sSN --max-time 120 "http://127.0.0.1:$port/v1/chat/completions" \
    -H "Authorization: Bearer $key" -H "Content-Type: application/json" \
    -d "{\"model\": \"smollm2-135m-instruct\", \"stream\": true, \"max_tokens\": $1,
         \"messages\": [{\"role\": \"user\", \"content\": \"Tell me about the sea.\"}]}" >"$2"
}
stream 16 "$work/stream.txt"
grep -q '^data: \[DONE\]' "$work/stream.txt" || { cat "$work/stream.txt" >&2; fail "the API stream did not end with [DONE]"; }
say "API stream: $(grep -c '"content"' "$work/stream.txt") chunks, then [DONE]"
started=$SECONDS
until [ "$(docker inspect --format '{{.State.Health.Status}}' "$name")" = healthy ]; do
  [ $((SECONDS - started)) -lt 120 ] || fail "the HEALTHCHECK did not turn healthy in 120 s"
  sleep 2
done
say "HEALTHCHECK healthy (after $((SECONDS - started)) s more; its interval is 30 s)"

# 4. docker stop while an answer streams: it ends whole, the exit status is 0. The server
# lets answers under way finish for GRACEFUL_TIMEOUT (30 s), then ends them as interrupted:
# a short answer, so that a slow, shared machine still finishes it in time.
stream 32 "$work/drained.txt" &
streaming=$!
until grep -q '"content"' "$work/drained.txt" 2>/dev/null; do sleep 0.2; done
started=$SECONDS
docker stop -t 45 "$name" >/dev/null
wait "$streaming" || true
status=$(docker inspect --format '{{.State.ExitCode}}' "$name")
finish=$(grep -o '"finish_reason": *"[a-z_]*"' "$work/drained.txt" | tail -n1 || true)
if [ -z "$finish" ] || grep -q '"error"' "$work/drained.txt"; then
  tail -3 "$work/drained.txt" >&2
  fail "the answer under way did not end whole (interrupted: not finished within GRACEFUL_TIMEOUT?)"
fi
[ "$status" = 0 ] || { docker logs "$name" 2>&1 | tail -20 >&2; fail "exit status $status after docker stop"; }
say "docker stop: the answer under way ended whole ($finish), exit 0, in $((SECONDS - started)) s"

# 5. The second start reuses the converted model.
docker rm "$name" >/dev/null
run
second_ready=$(ready_within 300)
docker logs "$name" >"$work/second.log" 2>&1
! grep -q "Converting" "$work/second.log" || fail "the second start converted the model again"
say "second start (no conversion): /readyz 200 after $second_ready s"

# 6. The size.
say "image $image: $((size / 1000000)) MB ($(docker image inspect --format '{{.Os}}/{{.Architecture}}' "$image"))"
say "PASSED: first ready $first_ready s, second ready $second_ready s, size $((size / 1000000)) MB"

# 7. docker-compose.yml's services with this image (IMAGE_TEST_COMPOSE=0 leaves them out).
docker rm -f "$name" >/dev/null
[ "${IMAGE_TEST_COMPOSE:-1}" = 0 ] || scripts/compose_test.sh "$image"
