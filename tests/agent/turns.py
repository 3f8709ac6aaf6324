"""Assistant-turn texts for scripted episodes."""


def code_turn(*directives: str, thought: str = "Let me check.") -> str:
    body = "\n".join(f"#! {d}" for d in directives) or "#! print ok"
    return f"{thought}\n<code>\n```python\n{body}\n```\n</code>"


def answer_turn(answer: str = "A") -> str:
    return f"I am sure now.\n<answer>\n\\boxed{{{answer}}}\n</answer>"
