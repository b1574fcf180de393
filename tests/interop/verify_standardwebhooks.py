"""Verify one captured vipwatch webhook with the PyPI `standardwebhooks` package (interop test).

Usage: verify_standardwebhooks.py SECRET BODY_FILE HEADERS_JSON_FILE
Prints the verified payload's `type` and exits 0, or raises (exit 1) when the signature is rejected.
"""
import json
import sys

from standardwebhooks.webhooks import Webhook

secret, body_file, headers_file = sys.argv[1:4]
with open(body_file, "rb") as f:
    body = f.read()
with open(headers_file) as f:
    headers = json.load(f)
payload = Webhook(secret).verify(body, headers)
print(payload["type"])
