"""The package root is the API's front door: every exported name is the object its module defines, and importing
the root alone loads none of the heavy machinery (torch, transformers) until a name is asked for."""

from __future__ import annotations

import subprocess
import sys
from importlib import import_module

import pytest

import posleak


def test_every_exported_name_is_its_modules_object() -> None:
    for name in posleak.__all__:
        value = getattr(posleak, name)
        module = posleak._EXPORTS.get(name)
        if module is not None:
            assert value is getattr(import_module(module), name), name
    assert set(posleak._EXPORTS) <= set(posleak.__all__)
    assert posleak.analyze.__module__ == "posleak.commands.analyze"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'analyse'"):
        posleak.analyse  # noqa: B018


def test_importing_the_root_loads_no_torch() -> None:
    code = "import sys, posleak; print('torch' in sys.modules); posleak.AnalyzeConfig; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["False", "True"]
