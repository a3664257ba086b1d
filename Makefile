# Two entry points on a fresh machine: `make run` (the paper reproduction) and `make test`; `make install` alone
# (the venv and the built-in models, no reproduction) is what the README's first run needs.
PY := .venv/bin/python
PIP := .venv/bin/pip

.PHONY: install run test lint clean

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	# The CPU build of torch lies on this machine's disk; a looser request pulls a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	touch $@

install: .venv/.installed
	.venv/bin/posleak fetch all

run: install
	.venv/bin/posleak paper --quick --out runs/paper

test: .venv/.installed
	.venv/bin/ruff check posleak tests benchmarks
	$(PY) -m pytest -q -ra

lint: .venv/.installed
	.venv/bin/ruff check posleak tests benchmarks

clean:
	rm -rf .venv runs
