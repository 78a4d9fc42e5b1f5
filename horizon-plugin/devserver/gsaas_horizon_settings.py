"""Settings of a Horizon serving GSaaS's panels against the dev cloud of
scripts/openstack-dev.sh (tests/openstack_clients.rs runs it): Horizon's own settings, with the
Keystone URL and where it serves from taken from the environment.

    GSAAS_HORIZON_KEYSTONE_URL   Keystone's v3 URL (default http://127.0.0.1:5000/v3)
    GSAAS_HORIZON_STATE          a directory for its static files and secret key
"""

import os

from openstack_dashboard.settings import *  # noqa: F401,F403

_STATE = os.environ.get("GSAAS_HORIZON_STATE", "/var/tmp/gsaas-clients/horizon-state")

DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
OPENSTACK_KEYSTONE_URL = os.environ.get("GSAAS_HORIZON_KEYSTONE_URL", "http://127.0.0.1:5000/v3")
OPENSTACK_KEYSTONE_DEFAULT_ROLE = "member"
# One process, no memcached: sessions in signed cookies, caches in memory.
SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
SECRET_KEY = "gsaas-horizon-devserver-not-for-production"
# Served over plain HTTP on 127.0.0.1.
SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False
STATIC_ROOT = os.path.join(_STATE, "static")
COMPRESS_ROOT = STATIC_ROOT
COMPRESS_OFFLINE = True
ROOT_URLCONF = "gsaas_horizon_urls"
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "root": {"handlers": ["console"], "level": "WARNING"}}
