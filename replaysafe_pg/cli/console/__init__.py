"""``replaysafe-pg console``: a small web app for operators and auditors (docs/console.md).

Server-rendered pages (Starlette, Jinja2; no JavaScript): actions that need a person
(unresolved and multi-effect), an action with its attempts and its timeline, threads and
LangGraph threads, and for operators ``resolve`` and ``reopen`` with a note. It reads and
writes as the connected role, through the same views and functions as any client: an
auditor's forms are not shown and the database refuses them anyway.

:func:`~replaysafe_pg.cli.console.app.create_app` builds the app; the command
(:mod:`replaysafe_pg.cli.console_command`) serves it with uvicorn. Needs the ``console``
extra.
"""
