"""What a pass or a render does once per app costs the same at ten thousand apps as at
ten: nothing it does for one app goes through every app. Calls are counted, not timed."""

from __future__ import annotations

from typing import Any

import pytest

from fabrique.decisions import changes
from fabrique.decisions.targets import new_target
from fabrique.decisions.writeback import Snapshot, desired_pin
from fabrique.site.config import load_site, parse_site
from fabrique.site.errors import InputError

DEPLOYED, PUSHED = "a" * 40, "b" * 40


class _Counted(list[Any]):
    """A list that counts the walks through it."""

    walks = 0

    def __iter__(self) -> Any:
        type(self).walks += 1
        return super().__iter__()


def test_an_app_is_found_by_name_without_walking_the_apps() -> None:
    """``Site.app`` is called for each app in a pass (the write-back of apps that share a
    file looks each one up): a walk of the apps each time made that pass quadratic."""
    from bench.render import values_with

    site = parse_site(values_with(50))
    counted = _Counted(site.apps)
    site = site.model_copy(update={"apps": counted})
    for app in site.apps[:]:
        assert site.app(app.name) is app
    assert _Counted.walks <= 1
    with pytest.raises(InputError, match="not in the site config"):
        site.app("nowhere")
    grown = site.model_copy(update={"apps": site.apps[:1]})
    with pytest.raises(InputError, match="not in the site config"):
        grown.app(site.apps[1].name)  # a copy with other apps is looked up in its own


class _Transport:
    """What ``needs_build`` reads: the deployed pin, its commit, the files changed."""

    def __init__(self, text: str, files: list[str]) -> None:
        self.text, self.files = text, files

    def read(self, repo: str, branch: str, path: str) -> Snapshot:
        return Snapshot(self.text, None)

    def resolve(self, repo: str, branch: str, ref: str) -> str | None:
        return DEPLOYED if DEPLOYED.startswith(ref) else None

    def is_ancestor(self, repo: str, branch: str, ancestor: str, descendant: str) -> bool:
        return True

    def files_changed(self, *args: Any) -> list[str]:
        return self.files


def test_the_files_fabrique_writes_are_listed_once_a_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Listing them goes through every app: once for each changed file made the plan of a
    push with many files cost the files times the apps."""
    site = load_site(env={})
    app = site.apps[0]
    pin = desired_pin(site, app, DEPLOYED, "sha256:" + "0" * 64)
    text = new_target(app.writeback.kind, pin, where="target")
    files = [f"{app.context}/file-{n}.txt" for n in range(40)]
    listed: list[object] = []
    real = changes.fabrique_paths

    def counting(site: Any) -> frozenset[str]:
        listed.append(site)
        return real(site)

    monkeypatch.setattr(changes, "fabrique_paths", counting)
    decision = changes.needs_build(site, _Transport(text, files), app.name, PUSHED)  # type: ignore[arg-type]
    assert decision.build and "40 file(s) changed" in decision.reason, decision
    assert len(listed) == 1
