#!/bin/sh
# Runs the interpreter of the project's virtual environment (set by .ci/run).
exec "${TUNIX_PW_PYTHON:?set TUNIX_PW_PYTHON to the venv python, e.g. .venv/bin/python}" "$@"
