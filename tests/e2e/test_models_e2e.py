"""Several models on one BatchGen, through real processes: `serve` with two served
models and a LoRA adapter on the first (simulated engine) starts one inference worker
for each model, and a batch whose lines name all three is answered line by line by
the model each named, the adapter's lines on its base model's worker."""

from __future__ import annotations

import json
import re
from collections import defaultdict

from tests.e2e.harness import wait_until

MODELS = ("alpha", "beta")
ADAPTER = "alpha-lora"  # on alpha: its lines go to alpha's worker
NAMES = (*MODELS, ADAPTER)


def mixed_lines(count: int, names: tuple[str, ...] = MODELS) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": names[i % len(names)],
                             "messages": [{"role": "user", "content": f"n {i}"}]}}).encode()
        + b"\n" for i in range(count))


def test_a_batch_mixing_two_models_is_answered_by_each_models_own_worker(start_server, tmp_path):
    storage = tmp_path / "storage0"  # start_server's first storage
    adapter = tmp_path / ADAPTER
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
    served = ",".join(f"{name}={storage / 'models' / name}" for name in MODELS)
    server, api = start_server(BATCHGEN_MODELS=f"{served},{ADAPTER}=lora:{adapter}@alpha",
                               BATCHGEN_CHUNK_SIZE="5")

    # /v1/models lists all three, each once its worker is live (the adapter's: alpha's)
    def all_live():
        data = api.http.get("/v1/models").json()["data"]
        return [m["id"] for m in data] == list(NAMES) and all(m["live"] for m in data) and data
    models = wait_until(all_live, timeout=120, message="all live")
    assert all(m["workers"] == 1 and "/v1/chat/completions" in m["endpoints"] for m in models)
    assert [m["parent"] for m in models] == [None, None, "alpha"]

    batch = api.create_batch(api.upload(mixed_lines(60, NAMES))["id"]).json()
    done = api.wait_status(batch["id"], {"completed", "failed"}, timeout=120)

    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 60, "completed": 60, "failed": 0}
    for line in api.content(done["output_file_id"]).splitlines():
        result = json.loads(line)
        named = NAMES[int(result["custom_id"].split("-")[1]) % 3]
        assert result["response"]["body"]["model"] == named
    # Each worker ran chunks of its own model only, and each model's chunks all ran
    ran = defaultdict(set)
    chunks = defaultdict(int)
    for worker, model in re.findall(r"chunk \S+ on (\S+) for model (\S+): done",
                                    server.log_path.read_text()):
        ran[worker].add(model)
        chunks[model] += 1
    assert sorted(ran.values(), key=sorted) == [{"alpha"}, {"beta"}]
    assert chunks == {"alpha": 8, "beta": 4}  # alpha's 20 lines and its adapter's 20
    pool = api.pool()
    assert [figures["model"] for figures in pool["models"]] == list(MODELS)
    assert sum(f["scheduling_pool_capacity"] for f in pool["models"]) == \
        pool["scheduling_pool_capacity"]


def test_a_line_naming_an_unserved_model_fails_the_batch_with_model_not_found(start_server):
    server, api = start_server()
    content = mixed_lines(2).replace(b'"alpha"', b'"m"').replace(b'"beta"', b'"gpt-4o"')

    batch = api.create_batch(api.upload(content)["id"]).json()
    done = api.wait_status(batch["id"], {"completed", "failed"}, timeout=60)

    assert done["status"] == "failed"
    errors = done["errors"]["data"]
    assert [(e["code"], e["line"], e["param"]) for e in errors] == [
        ("model_not_found", 2, "body.model")]
