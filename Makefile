# `make test` and `make lab` each set up everything they need from nothing:
# a virtual environment in .venv with the package and its dependencies, and
# the Graphviz `dot` binary. Running them again only redoes what changed.

VENV       := .venv
PYTHON     := $(VENV)/bin/python
INSTALLED  := $(VENV)/.installed
PYTEST_ARGS ?= -n 2

.PHONY: test lab bench dot clean

$(PYTHON):
	python3 -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[dev]'
	touch $@

# Graphviz's `dot` renders the split diagrams.
dot:
	@if ! command -v dot >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing Graphviz (dot) with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; \
	  else \
	    echo "Graphviz's 'dot' is missing. Install it, e.g. 'sudo apt-get install graphviz' (Debian/Ubuntu) or 'brew install graphviz' (macOS), then re-run."; \
	    exit 1; \
	  fi; \
	fi

test: $(INSTALLED) dot
	$(PYTHON) -m pytest $(PYTEST_ARGS)

# JupyterLab on the notebooks, on loopback only, with a token.
lab: $(INSTALLED) dot
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --no-browser \
	  --ServerApp.root_dir=notebooks

bench: $(INSTALLED)
	$(PYTHON) bench/engine.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
