"""An operator told to serve TFJobs refuses to start, in one line, on a cluster without the
TFJob CRD (kopf would watch a resource that is not there and serve nothing)."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import pytest
from aiohttp import web
from strategyjob_operator.kube import Credentials

main = importlib.import_module("strategyjob_operator.__main__")


async def check(resources: list[dict[str, Any]] | None, serve_tfjobs: bool) -> None:
    async def group(_: web.Request) -> web.Response:
        return web.json_response({"resources": [{"name": "strategyjobs"}]})

    async def kubeflow(_: web.Request) -> web.Response:
        if resources is None:
            return web.Response(status=404)
        return web.json_response({"resources": resources})

    app = web.Application()
    app.router.add_get("/apis/strategyjob.dev/v1alpha1", group)
    app.router.add_get("/apis/kubeflow.org/v1", kubeflow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        await main.check_cluster(Credentials(server=f"http://127.0.0.1:{port}"), 5.0, serve_tfjobs)
    finally:
        await runner.cleanup()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("resources", [None, [{"name": "pytorchjobs"}]])
def test_serving_tfjobs_without_their_crd_is_one_clear_error(resources: Any) -> None:
    with pytest.raises(
        main.StartupError,
        match=r"STRATEGYJOB_SERVE_TFJOBS is set but .* does not serve kubeflow.org/v1 tfjobs: "
        r"install the TFJob CRD",
    ):
        asyncio.run(check(resources, serve_tfjobs=True))
    asyncio.run(check(resources, serve_tfjobs=False))  # not asked to: no TFJob CRD needed


@pytest.mark.timeout(30)
def test_serving_tfjobs_with_their_crd_starts() -> None:
    asyncio.run(check([{"name": "tfjobs"}, {"name": "tfjobs/status"}], serve_tfjobs=True))
