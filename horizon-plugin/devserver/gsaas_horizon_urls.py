"""Horizon's URLs, and its collected static files served by Django itself (this development
server has no web server in front of it)."""

from django.conf import settings
from django.urls import re_path
from django.views.static import serve

from openstack_dashboard.urls import urlpatterns as horizon_urlpatterns

urlpatterns = list(horizon_urlpatterns) + [
    re_path(r"^static/(?P<path>.*)$", serve, {"document_root": settings.STATIC_ROOT}),
]
