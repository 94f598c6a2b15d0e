"""tests/mutate.py's catalogue stays aimed: a refactoring that moves a
mutant's line makes the mutant unrunnable (`make mutate` stops on it), and
nothing else would say so until someone ran it. Each mutant's source text
occurs exactly once in its file, the mutated file still compiles, and each
test it names exists."""

import ast
from pathlib import Path

import pytest

from tests.mutate import MUTANTS

ROOT = Path(__file__).resolve().parents[1]


def test_mutant_names_are_unique():
    names = [mutant.name for mutant in MUTANTS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mutant: mutant.name)
def test_each_mutant_finds_its_source_once_and_names_tests_that_exist(mutant):
    source = (ROOT / mutant.path).read_text()
    assert source.count(mutant.old) == 1, f"{mutant.name}: {mutant.old!r} occurs {source.count(mutant.old)} times"
    compile(source.replace(mutant.old, mutant.new), mutant.path, "exec")
    for test in mutant.tests:
        path, _, name = test.partition("::")
        module = ast.parse((ROOT / path).read_text())
        defined = {node.name for node in ast.walk(module) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        assert not name or name.split("::")[0].split("[")[0] in defined, f"{mutant.name}: no {test}"
