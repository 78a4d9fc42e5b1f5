# The tenant's VMs with cGPUs: Project > GPUs > VMs with GPUs.
PANEL = "gpus"
PANEL_DASHBOARD = "project"
PANEL_GROUP = "gpus"
ADD_PANEL = "gsaas_dashboard.content.project.gpus.panel.Gpus"
ADD_INSTALLED_APPS = ["gsaas_dashboard"]
