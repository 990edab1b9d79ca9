# `make test` and `make lab` each set up everything they need from nothing:
# a virtual environment in .venv with the package and its dependencies, and
# the Graphviz `dot` binary. Running them again only redoes what changed.

VENV       := .venv
PYTHON     := $(VENV)/bin/python
INSTALLED  := $(VENV)/.installed
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: test test-jax-oldest lab bench report notebooks docs dot chromium clean

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
	$(MAKE) test-jax-oldest
	$(MAKE) docs

# The documentation site (mkdocs-material; the API reference from the
# docstrings, the tutorials with their committed outputs), failing on any
# warning.
DOCS_OUT ?= docs/_build
docs: $(INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(DOCS_OUT)

# The engine and analysis tests again on the oldest JAX the package takes
# (JAX is a range): parity with that JAX's own checkpoint, in the same
# process. `make test-jax-oldest OLDEST_TESTS=...` runs others (test_parity,
# test_composition and test_scan pass there too; they are left out of
# `make test` for time).
OLDEST_VENV  := .venv-jax-oldest
OLDEST_JAX   := 0.10.0
OLDEST_TESTS ?= tests/test_engine.py tests/test_refs.py tests/test_lowering.py \
                tests/test_analysis.py tests/test_errors.py

$(OLDEST_VENV)/.installed: pyproject.toml
	python3 -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install --quiet 'jax==$(OLDEST_JAX)' 'jaxlib==$(OLDEST_JAX)'
	$(OLDEST_VENV)/bin/python -m pip install --quiet -e . pytest pytest-xdist pytest-timeout hypothesis
	touch $@

test-jax-oldest: $(OLDEST_VENV)/.installed
	$(OLDEST_VENV)/bin/python -c 'import jax; assert jax.__version__ == "$(OLDEST_JAX)", jax.__version__'
	$(OLDEST_VENV)/bin/python -m pytest -n 2 -p no:cacheprovider -q $(OLDEST_TESTS)

# JupyterLab on the notebooks, on loopback only, with a token. Notebooks
# saved there keep their widgets' state, so a reopened one draws its
# Explorers rather than "model not found" (a setting of this environment's
# JupyterLab only).
LAB_OVERRIDES = $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_OVERRIDES): $(INSTALLED)
	mkdir -p $(dir $@)
	echo '{"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": true}}' > $@

lab: $(INSTALLED) $(LAB_OVERRIDES) dot
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
	rm -rf $(VENV) $(OLDEST_VENV) .pytest_cache .hypothesis
