"""A mistyped command gets the one most likely meant: `raftq queus` -> `raftq queues`, and
`raftq queue list` -> `raftq queues` (whose help says "list queues").

The parsers raise their errors (`UsageError`) instead of exiting, so that `main` can say the
error as argparse does and add the suggestion. A word that is no command at its level is first
compared with that level's commands (argparse's own choices, by difflib); failing a close one,
the words typed so far are compared with every command's name and help, word by word.
"""

import argparse
import difflib
import re
import sys

CLOSE = 0.6          # difflib's own cutoff, for one word against the commands of its level
LIKELY = 0.8         # the mean over the typed words, against a command's name and help
HELP_WEIGHT = 0.9    # a word of a command's help counts a little less than its name


class UsageError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser, self.message = parser, message


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors raised; its subcommands' parsers are of this class too."""

    def error(self, message):
        raise UsageError(self, message)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """A parser's subcommands: name -> (parser, help). argparse keeps them in its actions only."""
    for action in parser._actions:       # argparse offers no public way to list them
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}
    return {}


def _commands(parser, path=()) -> list[tuple[tuple[str, ...], str]]:
    """Every command that runs, as (its words, its help)."""
    found = []
    for name, (sub, help_text) in _subcommands(parser).items():
        deeper = _commands(sub, (*path, name))
        found += deeper or [((*path, name), help_text)]
    return found


def _likeness(typed: list[str], names: tuple[str, ...], help_text: str) -> float:
    """How like a command the typed words are: each word's best match among the command's names,
    or, counting a little less, among the words of its help."""
    helps = re.findall(r"[a-z]+", help_text.lower())

    def best(word: str, among, weight: float) -> float:
        return weight * max((difflib.SequenceMatcher(None, word, w).ratio() for w in among), default=0.0)
    return sum(max(best(word, names, 1.0), best(word, helps, HELP_WEIGHT)) for word in typed) / len(typed)


def suggestion(top: argparse.ArgumentParser, error: UsageError, argv: list[str]) -> str | None:
    """The command most likely meant, as it is typed ("queues", "cluster status"), or None."""
    bad = re.search(r"invalid choice: '([^']*)'", error.message)
    if bad is None:
        return None
    word = bad.group(1)
    path = error.parser.prog.split()[1:]
    level = top
    for name in path:
        level = _subcommands(level)[name][0]
    close = difflib.get_close_matches(word, list(_subcommands(level)), n=1, cutoff=CLOSE)
    if close:
        words, below = [*path, close[0]], _subcommands(_subcommands(level)[close[0]][0])
        after = argv[argv.index(word) + 1:argv.index(word) + 2] if word in argv else []
        if below and after and after[0] in below:
            words.append(after[0])
        return " ".join(words)
    typed = [*path, word]
    scored = [(_likeness(typed, words, help_text), words) for words, help_text in _commands(top)]
    best, words = max(scored, key=lambda s: s[0], default=(0.0, ()))
    return " ".join(words) if best >= LIKELY else None


def report(top: argparse.ArgumentParser, error: UsageError, argv: list[str]) -> int:
    """The error as argparse says it (usage, then the error), then the suggestion; exit status 2."""
    error.parser.print_usage(sys.stderr)
    print(f"{error.parser.prog}: error: {error.message}", file=sys.stderr)
    meant = suggestion(top, error, argv)
    if meant:
        print(f"raftq: did you mean `raftq {meant}`?", file=sys.stderr)
    return 2
