"""The offline kit's stand-in judge: an OpenAI-compatible chat-completions server on localhost whose grades come from
the toy passage task's hidden gold, computed by a program, not a model.

    python offline.py --serve_judge          # http://127.0.0.1:8011/v1, model "kit-judge"; Ctrl-C stops it

It reads only what any judge reads, the request judge.py sends: the task (a passage of facts "Ava's kite is red." and
a question "What colour is Ava's kite?") and the responses between the request's nonce fences; and it answers the way
judge.py asks, reasoning then `VERDICT <nonce>: {json}`. So the CPU kit and the tests run judge_grpo.py end to end
(HTTP, fences, verdict parsing, the cache, the stats, the trainer) with no model to serve. Being a program, it cannot be
talked round; what a served model judge does with the same requests is tests/test_judge.py's and docs/rubric.md's
subject. Its grade, 0-10: 9 for the passage's colour alone in at most 12 words, 6 for it in a longer reply, 1 for a
wrong colour or several colours, 0 for none.
"""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "kit-judge"
PORT = 8011
COLOURS = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple")
FACT = re.compile(r"(\w+)'s (\w+) is (\w+)\.")
QUESTION = re.compile(r"What colour is (\w+)'s (\w+)\?")


def gold_colour(task: str) -> str | None:
    """The colour the passage gives the thing the question asks about, or None where it says none."""
    asked = QUESTION.search(task)
    if not asked:
        return None
    facts = {(name, thing): colour for name, thing, colour in FACT.findall(task)}
    return facts.get(asked.groups())


def grade(task: str, response: str) -> int:
    """The toy task's true quality of one response, 0-10 (the module docstring)."""
    said = {word for word in re.findall(r"[a-z]+", response.lower()) if word in COLOURS}
    gold = gold_colour(task)
    if not said:
        return 0
    if said != {gold}:
        return 1
    return 9 if len(response.split()) <= 12 else 6


def grade_each(task: str, responses: dict[str, str]) -> dict[str, int]:
    """{label: grade} for one request's responses, each graded alone."""
    return {label: grade(task, text) for label, text in responses.items()}


def reply(request: str, grader=grade_each) -> str:
    """The judge's reply to one user message from judge.py: a verdict for each fenced response (`grader(task,
    {label: response})`, where a pointwise request's one label is "score"), or "OK"."""
    asked = re.search(r"End with this line: VERDICT (\w+):", request)
    if not asked:
        return "OK"
    nonce = asked.group(1)
    task = re.search(rf"<task-{nonce}>\n(.*?)\n</task-{nonce}>", request, re.DOTALL)
    fences = re.findall(rf"<response-{nonce}( \w+|)>\n(.*?)\n</response-{nonce}\1>", request, re.DOTALL)
    grades = grader(task.group(1) if task else "", {label.strip() or "score": text for label, text in fences})
    return f"Each response checked against the colour the passage gives.\nVERDICT {nonce}: {json.dumps(grades)}"


class Handler(BaseHTTPRequestHandler):
    grader = staticmethod(grade_each)

    def log_message(self, *args):  # quiet: a training run's log is the place to read
        pass

    def do_GET(self):
        self.send_json({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "grpo-recipes"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        messages = body.get("messages") or [{"content": ""}]
        asked = str(messages[-1].get("content") or "")
        content = reply(asked, self.grader)
        self.send_json({"id": "kit-judge", "object": "chat.completion", "created": 0, "model": body.get("model", MODEL),
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}],
                        "usage": {"prompt_tokens": len(asked.split()), "completion_tokens": len(content.split()),
                                  "total_tokens": len(asked.split()) + len(content.split())}})

    def send_json(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def start(port: int = 0, grader=grade_each) -> tuple[ThreadingHTTPServer, str]:
    """The judge serving in a background thread on 127.0.0.1 (port 0: a free one); its server and base URL. `grader`
    replaces the program's grades (experiments/judge_demo.py serves a learned judge through it)."""
    handler = type("GradingHandler", (Handler,), {"grader": staticmethod(grader)})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def serve(port: int = PORT) -> None:
    """Serve until Ctrl-C."""
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"kit judge ({MODEL}) at http://127.0.0.1:{port}/v1; Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass

