from django.urls import re_path

from gsaas_dashboard.content.project.gpus import views

urlpatterns = [
    re_path(r"^$", views.IndexView.as_view(), name="index"),
    re_path(r"^launch/$", views.LaunchView.as_view(), name="launch"),
    re_path(r"^(?P<vm_id>[^/]+)/attach/$", views.AttachView.as_view(), name="attach"),
    re_path(r"^(?P<vm_id>[^/]+)/detach/$", views.DetachView.as_view(), name="detach"),
]
