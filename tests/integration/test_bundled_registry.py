"""The registry and tools that ship in the repository (what ``make serve`` runs) work as they are:
the utility sidecar and the autodiscovered example script in ``tools/auto``."""

import shutil

import msgspec

from supervisor.calls.call import InvokeRequest
from tests.conftest import REPO, raw, running_host, wait_available


async def test_bundled_registry_serves_the_utility_and_the_auto_example(app):
    shutil.copytree(REPO / "tools", app / "tools")
    manifests = [str(REPO / "manifests")]
    async with running_host(app, manifest_dirs=manifests) as host:
        await wait_available(host, "file.hash", "text_stats", timeout=30)
        d = host.catalog.get("text_stats")
        assert d.sidecar == "auto:tools/auto" and d.inputSchema["required"] == ["action", "text"]
        assert d.description.startswith("Count the characters")
        env = await host.invoker.invoke(
            InvokeRequest("text_stats", raw({"action": "slug", "text": "Héllo, Wörld!"}))
        )
        assert env.status == "success" and msgspec.json.decode(env.data) == {"slug": "hello-world"}
        env = await host.invoker.invoke(
            InvokeRequest("text_stats", raw({"action": "count", "text": 5}))
        )
        assert env.status == "failed" and env.content == "text must be a string"
        assert host.views.snapshot().registry.errors == []
