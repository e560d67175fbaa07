"""E-mail delivery of trainguard alerts through SendGrid.

A long-lived notifier (``python -m notifier`` or ``trainguard-email``) that
consumes the alert payload of ``transforms/records.py`` (``Alert.to_row``) from
the Pub/Sub alerts subscription or the local alerts JSONL file, groups the
alerts of a run into one digest e-mail, and sends it with SendGrid's official
client. See ``docs/email.md``.

Modules, in the order an alert passes through them:

* ``sources``: where alerts come from (Pub/Sub streaming pull, a tailed JSONL file);
* ``alerts``: the payload, parsed;
* ``grouping``: per-run groups that close a configurable wait after their first alert;
* ``render``: subject, HTML body and plain-text alternative (everything escaped);
* ``notifier``: dedup, daily budget and summary folding, retries, acks;
* ``sending``: SendGrid (or ``--dry_run`` files) and the retry policy;
* ``deadletter``: where alerts go when SendGrid refuses them for good;
* ``state``: the persisted sent ids, daily budget and file offsets (SQLite);
* ``config`` / ``api_key`` / ``cli``: configuration, the API key, the entry point.
"""
