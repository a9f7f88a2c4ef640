"""Serving: what the daemon offers to the outside.

The Prometheus collector (``exporter``), the HTTP server (``httpserver``) and its TLS and
auth settings (``webconfig``), systemd's notify protocol (``sdnotify``), the privacy
switch (``privacy``) and the daemon's configuration (``config``). They read the store;
none of them samples anything.
"""
