"""The Run page's "Manage this run": archive and restore, rename and re-tag, and delete behind
a confirmation, each through ``noisescope.Api`` on the real server, on a run of this test's
own (the synthetic runs other tests read stay as they are)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from harness import columns
from noisescope import Api, NotFoundError, protocol

from ._app import plain, texts
from .conftest import MakeApp


def _own_run(url: str) -> str:
    uid = uuid.uuid4().hex
    base = f"{url}{protocol.API_PREFIX}/runs/{uid}"
    body = {"project": "admin-page", "task": "t", "name": "before", "batch_size": 32}
    with httpx.Client() as http:
        assert http.put(base, json=body).status_code == 201
        assert http.post(f"{base}/samples", json={"columns": columns(100)}).status_code == 200
    return uid


def test_archive_restore_rename_tags_and_delete(make_app: MakeApp, server: str, api: Api) -> None:
    uid = _own_run(server)
    at = make_app(server, "run", run=uid)
    assert at.button(key=f"delete_{uid}").disabled  # not before the confirmation

    at.button(key=f"archive_{uid}").click().run()
    assert not at.exception
    assert api.run(uid).archived_at is not None
    assert "Archived the run." in at.success[0].value
    assert "Archived on " in plain(texts(at))
    at.button(key=f"restore_{uid}").click().run()
    assert api.run(uid).archived_at is None and "Restored the run." in at.success[0].value

    at.text_input(key=f"name_{uid}").input("after")
    at.text_input(key=f"tags_{uid}").input(" a, b ,, c")
    (save,) = [b for b in at.button if b.label == "Save name and tags"]
    save.click().run()
    assert not at.exception
    run = api.run(uid)
    assert (run.name, run.tags) == ("after", ["a", "b", "c"])

    at.checkbox(key=f"sure_{uid}").check().run()
    at.button(key=f"delete_{uid}").click().run()
    assert not at.exception
    with pytest.raises(NotFoundError):
        api.run(uid)
    assert f"Deleted run {uid}" in plain(at.success[0].value)
    assert at.query_params.get("run") != [uid]  # the page moved on to another run


def test_with_a_read_token_the_fold_says_what_it_needs(make_app: MakeApp, auth_server: str) -> None:
    """docs/deployment.md gives the dashboard a read token: its Manage fold then offers no
    change and says which token it needs; with ``manage`` the changes are there."""
    from .conftest import ADMIN

    def token(scopes: list[str]) -> str:
        answer = httpx.post(
            f"{auth_server}/api/v1/projects/vision/tokens",
            json={"name": "dashboard-fold", "scopes": scopes},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert answer.status_code == 201, answer.text
        return str(answer.json()["token"])

    read, manage = token(["read"]), token(["read", "manage"])
    uid = Api(auth_server, token=read).runs()[0].uid
    at = make_app(auth_server, "run", token=read, run=uid)
    said = plain(texts(at))
    assert "need a token with the `manage` scope" in said.replace("\\", "")
    assert "noisescope token create --project vision --scope read,manage" in said
    assert f"delete_{uid}" not in [b.key for b in at.button]
    at = make_app(auth_server, "run", token=manage, run=uid)
    assert f"delete_{uid}" in [b.key for b in at.button]
    assert "need a token with the" not in plain(texts(at))
