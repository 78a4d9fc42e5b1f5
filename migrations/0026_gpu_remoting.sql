-- [4/6] The remote-GPU layer each GPU's server speaks (`rcuda`, `lupine`), also in its
-- attributes: a column of its own so that the route tables, read for every host at once, name
-- each route's layer without parsing JSON. Every GPU registered before speaks rCUDA.
ALTER TABLE gpus ADD COLUMN remoting TEXT NOT NULL DEFAULT 'rcuda';
