# `make test` and `make lab` each set up everything they need from nothing:
# a virtual environment in .venv with the package and its dependencies, and
# the Graphviz `dot` binary. Running them again only redoes what changed.

VENV       := .venv
PYTHON     := $(VENV)/bin/python
INSTALLED  := $(VENV)/.installed
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: test lab bench report notebooks dot chromium clean

$(PYTHON):
	python3 -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[dev,lab]'
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

# Debian's Chromium drives the browser tests (through Playwright).
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing Chromium with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "Chromium is missing: the browser tests will fail. Install it with 'sudo apt-get install chromium'."; \
	  fi; \
	fi

test: $(INSTALLED) dot chromium
	$(PYTHON) -m pytest $(PYTEST_ARGS)

# JupyterLab on the notebooks, on loopback only, with a token.
lab: $(INSTALLED) dot
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --no-browser \
	  --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

bench: $(INSTALLED)
	$(PYTHON) bench/engine.py
	$(PYTHON) bench/lowering.py
	$(PYTHON) bench/analysis.py
	$(PYTHON) bench/viz.py
	$(PYTHON) bench/scans.py

# A self-contained HTML report on the example transformer whose layers are a
# scan (its policies differ on the CPU too).
report: $(INSTALLED) dot
	$(PYTHON) -m remat_explorer report --model transformer_scan --out report.html

# Execute the tutorials in place, so they are committed with their outputs.
notebooks: $(INSTALLED) dot
	$(PYTHON) tests/run_notebooks.py --write notebooks/*.ipynb

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
