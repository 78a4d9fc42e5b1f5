-- A tainted GPU keeps the cGPUs it has and takes no new ones; the column says why (NULL: it takes
-- them). An admin taints a GPU, and gsaasd does when a host's agent refuses routes to it.
ALTER TABLE gpus ADD COLUMN taint TEXT;
