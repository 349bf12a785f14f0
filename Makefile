# Two entry points for a fresh machine:
#   make demo   -- creates .venv, installs torch_mz, runs the main demo
#   make test   -- creates .venv, installs torch_mz with its test extras, runs the test suite
#
# The virtual environment sees the system site-packages, so a torch that is already installed
# (CPU or CUDA, 2.5 or later: setup.cfg's floor) is used as it is. Only when no such torch can be
# imported is $(TORCH_SPEC) installed (a CPU build where one is available locally). Override, e.g.
#   make test TORCH_SPEC='torch==2.5.1'
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test install install-test clean

$(VENV)/bin/python:
	$(PYTHON) -m venv --system-site-packages $(VENV)

$(VENV)/.torch: | $(VENV)/bin/python
	$(PY) -c "import sys, torch; sys.exit(tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2]) < (2, 5))" 2>/dev/null || $(PIP) install "$(TORCH_SPEC)"
	touch $@

$(VENV)/.installed: setup.cfg pyproject.toml $(VENV)/.torch
	$(PIP) install -e ".[datasets,plot]"
	touch $@

$(VENV)/.installed-test: setup.cfg pyproject.toml $(VENV)/.installed
	$(PIP) install -e ".[datasets,plot,test]"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(PY) -m torch_mz.demo

test: $(VENV)/.installed-test
	$(PY) -m pytest -q tests $(PYTEST_ARGS)

# build/ and dist/ too: setuptools reuses build/lib, so a wheel built again would ship modules
# deleted since
clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis .mypy_cache
