"""``trainguard-dashboard``: a web dashboard of a trainguard store (alerts, tests, runs, dead letters, triage).

``dashboard.app.create_app`` is the ASGI application; ``dashboard.cli`` its command line.
"""
