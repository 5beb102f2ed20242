# raco: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
PYTEST  ?= $(BIN)/pytest
RACO    := $(BIN)/raco
STAMP   := $(VENV)/.installed
TORCH_PIN := torch==2.13.0
DATASET ?= adult
MUTANT_JOBS ?= 2
ARGS    ?=

# Offline mirror of the datasets: $RACO_DATA_MIRROR, else ../shared/datasets beside the checkout,
# else /work/shared/datasets (the same fallbacks as .ci/run).
RACO_DATA_MIRROR ?= $(firstword $(foreach d,../shared/datasets /work/shared/datasets,$(if $(wildcard $(d)),$(abspath $(d)))))
export RACO_DATA_MIRROR

help: ## show this help
	@grep -E '^[a-zA-Z0-9_%-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_PIN)
	$(BIN)/pip install --quiet -e '.[dev]' $(TORCH_PIN)
	@touch $(STAMP)

install: $(STAMP) ## create .venv and install raco (torch pinned to the local CPU wheel)

train: $(STAMP) ## the main job: raco train dataset=adult constraint=dp eps=1 (ARGS=... adds overrides)
	$(RACO) train dataset=adult constraint=dp eps=1 $(ARGS)

test: $(STAMP) ## fast tests + doctests (not slow, not gpu, not slurm)
	RACO_HYPOTHESIS_PROFILE=ci $(PYTEST) -m "not slow and not gpu and not slurm" -n 2 -q

test-mutants: $(STAMP) ## privacy mutation suite: plant each bug of tests/mutants/ in a scratch copy, run the tests that must catch it
	$(BIN)/python tests/mutants/mutate.py --jobs $(MUTANT_JOBS) $(ARGS)

test-slow: $(STAMP) ## slow tests only (~8 min on 2 cores; CI runs them)
	RACO_HYPOTHESIS_PROFILE=ci $(PYTEST) -m "slow and not gpu and not slurm" -n 2 -q

test-widths: $(STAMP) ## a run equals itself in any group under every instruction set the host can run (AVX-512, AVX2, SSE; slow)
	$(PYTEST) -q -p no:cacheprovider -m slow tests/e2e/test_instruction_sets.py

test-trust: $(STAMP) ## trust suite incl. slow: audit, bad input, data/process/numerical faults, concurrency
	$(PYTEST) -q -p no:cacheprovider tests/unit/audit tests/config/test_bad_input.py tests/unit/data/test_data_faults.py \
		tests/unit/methods/test_numerical_faults.py tests/unit/privacy/test_secure_rng.py tests/e2e/test_trust.py tests/e2e/test_concurrency.py

audit: $(STAMP) ## privacy audit of RaCO-DP on Adult: make audit ARGS="eps=4 audit.mechanism=broken_no_noise"
	$(RACO) audit dataset=adult $(ARGS)

test-gpu: $(STAMP) ## GPU tests (skipped without CUDA)
	$(PYTEST) -m gpu -q

test-slurm: $(STAMP) ## SLURM launcher against a one-node cluster it starts on localhost (root: installs slurm-wlm, munge)
	bash tests/slurm/cluster.sh $(PYTEST) -m slurm -q -p no:cacheprovider tests/slurm

test-all: $(STAMP) ## every test
	$(PYTEST) -q

lint: $(STAMP) ## ruff
	$(BIN)/ruff check raco_cli tests

typecheck: $(STAMP) ## mypy
	$(BIN)/mypy

data: $(STAMP) ## download + verify a dataset: make data DATASET=adult
	$(RACO) data fetch $(DATASET)

bench: $(STAMP) ## time per step on Adult, batch 512, then batched per-run cost at R=20,160: make bench ARGS="--methods sgd,dp_sgd,raco_dp,dp_fermi,dpse --baseline sgd"
	$(BIN)/python -m raco_cli.bench $(ARGS)

bench-celeba: $(STAMP) ## ResNet16 images/s: RaCO-DP, DP-SGD vs SGD on one device (ARGS="--image-size 64 --dataset celeba")
	$(BIN)/python -m raco_cli.bench_images $(ARGS)

bench-noise: $(STAMP) ## ResNet16's secure noise step: old host/numpy path vs the current one (ARGS="--threads 1 --chacha")
	$(BIN)/python -m raco_cli.bench_noise $(ARGS)

sweep-%: $(STAMP) ## run a paper sweep: make sweep-fig4_adult [SMOKE=1] [ARGS=...]
	$(RACO) train +sweep=$* $(if $(SMOKE),hydra.sweeper.smoke=true) $(ARGS)

figures: $(STAMP) ## every paper figure with runs in MLflow -> outputs/figures/ [SMOKE=1]
	$(RACO) figures $(if $(SMOKE),--smoke) $(ARGS)

fig-%: $(STAMP) ## one figure: make fig-fig4_adult [SMOKE=1]
	$(RACO) figures $* $(if $(SMOKE),--smoke) $(ARGS)

# every CPU figure/table of the paper (order: fig2b, fig3 and fig8b reuse fig4_adult's runs; names = figure names)
REPRODUCE ?= fig4_adult fig2b_adult fig3_satisfiability fig4_credit fig4_parkinsons fig5_adult fig5_heart \
	fig6_credit fig8a_clipping fig8b_hard_soft fig9_low_eps table2_timing
REPRODUCE_FIGURES := $(if $(SMOKE),outputs/figures,docs/figures)

empty :=
space := $(empty) $(empty)
comma := ,

# The sweeps run in two chains side by side, each on half the cores (RACO_JOBS or the affinity;
# one torch thread per worker), when there are two or more: a sweep's parallel workers wait at its
# end for its slowest job, whole sweeps side by side do not.  A chain is one `raco train +sweep=a,b,...` (torch, MLflow and the datasets
# load once per chain); its output lines are prefixed [1] or [2].  The chains are balanced by the
# sweeps' measured costs (docs/reproduction.md); a view of a sweep's runs (fig2b, fig3, fig8b:
# they reuse fig4_adult's runs) comes after that sweep in its chain, or it would train them a
# second time side by side; a sweep not named below goes to chain 1; Table 2 (timings) runs
# alone after both.  On one core: one chain.  The figures are drawn by two `raco figures` side by
# side (each chain's; Table 2's with chain 2's).
REPRODUCE_CHAIN_2 := fig4_credit fig5_heart fig6_credit fig9_low_eps fig8a_clipping
REPRODUCE_ALONE := table2_timing
reproduce_alone = $(filter $(REPRODUCE_ALONE),$(REPRODUCE))
reproduce_chain_2 = $(filter $(REPRODUCE_CHAIN_2),$(REPRODUCE))
reproduce_chain_1 = $(filter-out $(REPRODUCE_CHAIN_2) $(REPRODUCE_ALONE),$(REPRODUCE))
sweep_list = +sweep=$(subst $(space),$(comma),$(strip $(1)))
REPRODUCE_TRAIN = $(RACO) train $(call sweep_list,$(1)) $(if $(SMOKE),hydra.sweeper.smoke=true) $(ARGS)
REPRODUCE_DRAW = $(RACO) figures $(1) $(if $(SMOKE),--smoke,--small) --out $(REPRODUCE_FIGURES) --no-log

reproduce: $(STAMP) ## every CPU sweep, figure and docs/reproduction.md table; resumable; total wall time at the end [SMOKE=1] [REPRODUCE="fig4_adult ..."]
	@start=$$(date +%s); failed=""; \
	cores=$$($(BIN)/python -c 'from raco_cli.cli.paths import cpu_count; print(cpu_count())'); \
	if [ "$$cores" -ge 2 ] && [ -n "$(strip $(reproduce_chain_1))" ] && [ -n "$(strip $(reproduce_chain_2))" ]; then \
	  ( RACO_JOBS=$$((cores / 2)) OMP_NUM_THREADS=1 $(call REPRODUCE_TRAIN,$(reproduce_chain_1)) 2>&1 | sed -u 's/^/[1] /'; exit $${PIPESTATUS[0]} ) & one=$$!; \
	  ( RACO_JOBS=$$((cores / 2)) OMP_NUM_THREADS=1 $(call REPRODUCE_TRAIN,$(reproduce_chain_2)) 2>&1 | sed -u 's/^/[2] /'; exit $${PIPESTATUS[0]} ) & two=$$!; \
	  wait $$one || failed="$$failed sweeps"; wait $$two || failed="$$failed sweeps"; \
	elif [ -n "$(strip $(reproduce_chain_1) $(reproduce_chain_2))" ]; then \
	  $(call REPRODUCE_TRAIN,$(reproduce_chain_1) $(reproduce_chain_2)) || failed="$$failed sweeps"; \
	fi; \
	$(if $(strip $(reproduce_alone)),$(call REPRODUCE_TRAIN,$(reproduce_alone)) || failed="$$failed sweeps";) \
	if [ "$$cores" -ge 2 ] && [ -n "$(strip $(reproduce_chain_1))" ] && [ -n "$(strip $(reproduce_chain_2) $(reproduce_alone))" ]; then \
	  ( $(call REPRODUCE_DRAW,$(reproduce_chain_1)) ) & one=$$!; \
	  $(call REPRODUCE_DRAW,$(reproduce_chain_2) $(reproduce_alone)) || failed="$$failed figures"; \
	  wait $$one || failed="$$failed figures"; \
	else \
	  $(call REPRODUCE_DRAW,$(REPRODUCE)) || failed="$$failed figures"; \
	fi; \
	elapsed=$$(( $$(date +%s) - start )); \
	$(RACO) report --reproduction $(if $(SMOKE),--smoke) --wall-time $$elapsed --sweeps "$(REPRODUCE)" || failed="$$failed report"; \
	echo "make reproduce: total wall time $$((elapsed / 60)) min $$((elapsed % 60)) s (sweeps + figures; goal <= 15 min on 2 idle cores: $$([ $$elapsed -le 900 ] && echo met || echo not met))"; \
	if [ -n "$$failed" ]; then echo "make reproduce: failed:$$failed (re-run to resume)"; exit 1; fi

dro-noise: $(STAMP) ## DP-DRO where noise dominates (docs/dro.md): digits-ST MLP, 4 DP methods tuned alike x eps {0.5,1,5} x 5 seeds + non-private SGDA and SPIDER; sweep, table, wall time [SMOKE=1]
	@start=$$(date +%s); \
	$(RACO) train +sweep=dro_noise $(if $(SMOKE),hydra.sweeper.smoke=true) $(ARGS) && \
	$(RACO) figures dro_noise $(if $(SMOKE),--smoke,--small) --out $(REPRODUCE_FIGURES) --no-log; status=$$?; \
	echo "make dro-noise: wall time $$(( $$(date +%s) - start )) s (sweep + table)"; exit $$status

report-%: $(STAMP) ## Pareto table + satisfaction of an experiment: make report-fig4_adult
	$(RACO) report $* $(ARGS)

ui: $(STAMP) ## MLflow UI on the embedded store (http://127.0.0.1:5000)
	$(BIN)/mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db --host 127.0.0.1 --port 5000

clean-outputs: ## delete outputs/ (runs, MLflow store, figures)
	rm -rf outputs

.PHONY: help install train test reproduce dro-noise test-mutants test-slow test-trust audit test-gpu test-slurm test-all lint typecheck data bench bench-celeba bench-noise figures ui clean-outputs
