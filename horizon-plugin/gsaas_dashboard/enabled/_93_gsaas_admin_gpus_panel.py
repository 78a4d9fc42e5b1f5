# The operators' view: Admin > GPUs > GPU Pool.
PANEL = "gpus"
PANEL_DASHBOARD = "admin"
PANEL_GROUP = "gpus"
ADD_PANEL = "gsaas_dashboard.content.admin.gpus.panel.Gpus"
# (gsaas_dashboard is added to INSTALLED_APPS by _91_gsaas_project_gpus_panel.py.)
