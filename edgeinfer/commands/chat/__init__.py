"""The terminal chat: session.py (the conversation), backends.py (in-process or a server),
repl.py (the loop, commands, input and output)."""
