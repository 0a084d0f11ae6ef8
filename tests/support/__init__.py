"""What the tests share, one module per concept; fixtures stay in tests/conftest.py.

- `command`: run `memagent` as a user would, and check what the user reads.
- `story`: the README's example document and its planted fact.
- `models`: the tiny test model's recipe, and where the model under test is.
- `scripted`: a backend that replies from a script, for the loop with no model.
- `fake_openai`, `fake_hub`: stand-in servers on 127.0.0.1.
- `builders`, `handmade`: real PDFs and EPUBs, and hand-made broken ones.
- `hf_model`, `gguf_files`, `qwen_material`: Hugging Face folders, GGUF files read back,
  and the real Qwen2.5 test material.
- `cli_docs`: docs/cli.md made from `--help`.

pytest puts tests/ on sys.path (pyproject.toml's `pythonpath`), so a test imports
`from support.command import words`; bench/ scripts put tests/ there themselves.
"""
