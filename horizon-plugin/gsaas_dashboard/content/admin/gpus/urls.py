from django.urls import re_path

from gsaas_dashboard.content.admin.gpus import views

urlpatterns = [
    re_path(r"^$", views.IndexView.as_view(), name="index"),
    re_path(r"^gpus/(?P<gpu_id>[^/]+)/taint/$", views.TaintView.as_view(), name="taint"),
]
