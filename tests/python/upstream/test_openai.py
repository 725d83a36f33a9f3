"""The `openai` Python client (the library OpenAI-style applications use) against llama-server
with the shipped Spark model and the plugin: models, completions and chat completions (plain and
streamed) give the greedy texts of llama.cpp's own tools, and bad requests, a wrong API key, an
endpoint the server lacks and a server that is gone surface as the client's exceptions with the
server's message. At the end, the plugin's table shows that the requests ran on the Spark
kernels."""

from __future__ import annotations

import pytest

from upstream_helpers import (CFG, TARGET_KEEP, Server, assert_stats_table, gemma2_prompt,
                              llama_completion)

try:
    import openai
except ImportError:  # a failure, not a skip: setup.sh installs it
    openai = None

ALIAS = "spark-shakespeare"
N_PREDICT = 32
PROMPT = "ROMEO:"
MESSAGE = "Who is there?"
API_KEY = "sk-spark-test"
GREEDY = {"temperature": 0, "seed": 1}


def client_for(srv: Server, api_key: str = "none") -> "openai.OpenAI":
    if openai is None:
        pytest.fail("the openai package is missing: `bash tools/setup.sh` installs "
                    "tests/requirements.txt", pytrace=False)
    # no retries: an error is seen as the server sent it
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai_server(shipped_f32_chat, tmp_path_factory):
    """The shipped model with Gemma-2's chat template in the file, named ALIAS, with the plugin
    and SPARK_STATS=1 (4 slots of 256 tokens)."""
    srv = Server(shipped_f32_chat, tmp_path_factory.mktemp("oai-server"), "--alias", ALIAS,
                 with_plugin=True, stats=True)
    yield srv
    srv.kill()


def test_models_list(oai_server):
    models = client_for(oai_server).models.list()
    assert [m.id for m in models.data] == [ALIAS], models
    assert models.data[0].object == "model", models


def test_completions_plain_and_streamed(oai_server, shipped_f32_chat):
    """completions.create: the greedy text of llama-completion (with the plugin) on the same
    file; streamed, the chunks add up to it."""
    client = client_for(oai_server)
    got = client.completions.create(model=ALIAS, prompt=PROMPT, max_tokens=N_PREDICT, **GREEDY)
    text = got.choices[0].text
    want, res = llama_completion(shipped_f32_chat, PROMPT, N_PREDICT, True, stats=False)
    assert text == want, f"openai completions: {text!r}\nllama-completion: {want!r}\n{res.command}"
    assert got.usage.completion_tokens == N_PREDICT, got
    assert got.choices[0].finish_reason == "length", got
    assert got.model == ALIAS, got.model
    chunks = list(client.completions.create(model=ALIAS, prompt=PROMPT, max_tokens=N_PREDICT,
                                            stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text, chunks
    print(f"\ncompletions {PROMPT!r} -> {text!r}")


def test_chat_plain_and_streamed(oai_server):
    """chat.completions.create: the file's template renders the message (the native /completion
    of that prompt gives the same text); streamed, the deltas add up to the same reply."""
    client = client_for(oai_server)
    messages = [{"role": "user", "content": MESSAGE}]
    got = client.chat.completions.create(model=ALIAS, messages=messages, max_tokens=N_PREDICT,
                                         **GREEDY)
    reply = got.choices[0].message
    assert reply.role == "assistant" and reply.content.strip(), got
    assert got.choices[0].finish_reason == "length", got
    native = oai_server.post("/completion", {"prompt": gemma2_prompt(MESSAGE),
                                             "n_predict": N_PREDICT, **GREEDY})
    assert native["content"] == reply.content, (native["content"], reply.content)
    assert got.usage.prompt_tokens == native["tokens_evaluated"], (got.usage, native)

    stream = client.chat.completions.create(model=ALIAS, messages=messages, max_tokens=N_PREDICT,
                                            stream=True, **GREEDY)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert deltas[0].role == "assistant", deltas[:2]
    assert "".join(d.content or "" for d in deltas) == reply.content, deltas
    print(f"\nchat {MESSAGE!r} -> {reply.content!r}")


def test_bad_requests_raise_the_clients_exceptions(oai_server):
    """HTTP errors come back as openai's exception classes, with llama-server's message."""
    client = client_for(oai_server)
    # a prompt longer than a slot's context (256 tokens): 400
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=ALIAS, prompt="ROMEO and JULIET " * 200, max_tokens=4)
    assert e.value.status_code == 400 and "exceeds the available context size" in e.value.message
    assert e.value.body.get("type") == "exceed_context_size_error", e.value.body
    # a field of the wrong type: 400
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"temperature": "hot"})
    assert "temperature" in e.value.message, e.value.message
    # a model the server does not have
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.status_code == 404, e.value
    # embeddings from a server started without --embeddings: 501
    with pytest.raises(openai.InternalServerError) as e:
        client.embeddings.create(model=ALIAS, input="ROMEO")
    assert e.value.status_code == 501 and "--embeddings" in e.value.message, e.value.message


def test_api_key(shipped_f32_chat, server_factory):
    """A server started with --api-key: a client with another key gets AuthenticationError
    (401), one with the key its completion."""
    srv = server_factory(shipped_f32_chat, "--alias", ALIAS, "--api-key", API_KEY,
                         with_plugin=True)
    with pytest.raises(openai.AuthenticationError) as e:
        client_for(srv, "sk-wrong").models.list()
    assert e.value.status_code == 401, e.value
    got = client_for(srv, API_KEY).completions.create(model=ALIAS, prompt=PROMPT, max_tokens=4,
                                                      **GREEDY)
    assert got.choices[0].text, got


def test_requests_ran_on_the_spark_kernels_and_a_gone_server_is_a_connection_error(oai_server):
    """After a request, the server is stopped (SIGINT): its table shows every layer's sparse
    FFN and attention ran; the client then gets APIConnectionError, not a hang."""
    client = client_for(oai_server)
    client.completions.create(model=ALIAS, prompt=PROMPT, max_tokens=4, **GREEDY)
    rc, log = oai_server.stop()
    assert rc == 0, oai_server.explain(f"exit status {rc} after SIGINT")
    assert_stats_table(log, CFG["n_layers"], TARGET_KEEP, explain=oai_server.explain)
    with pytest.raises(openai.APIConnectionError):
        client.completions.create(model=ALIAS, prompt=PROMPT, max_tokens=4, **GREEDY)
