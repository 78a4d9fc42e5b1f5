//! What a request names, looked up: its flavor, image and networks by id or name, checked to be
//! the tenant's to use, and what a project's checks found, kept for `lookup_cache_secs`.

use super::*;

/// What a check looks up, for whom: the project (`None`: the service user) and the request's
/// flavor, image and networks as it names them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct LookupKey {
    project: Option<String>,
    flavor: String,
    image: String,
    networks: Vec<String>,
}

/// The most checks [`NovaCloud::lookups`] keeps: past it, expired ones go, then all.
pub(super) const LOOKUPS_KEPT: usize = 4096;

/// An answer of `service_type` without the `key` it must have.
fn unexpected(service_type: &str, key: &str) -> CloudError {
    CloudError::Unavailable {
        reason: format!("unexpected answer from {}: no {key:?}", service_name(service_type)),
        source: None,
    }
}

/// A part of an answer already parsed as JSON, read as `T`.
fn parse_value<T: serde::de::DeserializeOwned>(
    service_type: &str,
    value: Value,
) -> Result<T, CloudError> {
    serde_json::from_value(value).map_err(|e| CloudError::Unavailable {
        reason: format!("unexpected answer from {}", service_name(service_type)),
        source: Some(Box::new(e)),
    })
}

/// Where a resource is looked up by id, and where listed by name (see
/// [`NovaCloud::id_or_name`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Lookup {
    /// The path an id is appended to.
    one: &'static str,
    /// The key the one resource is wrapped in, if it is (`{"network": {...}}`).
    wrapped: Option<&'static str>,
    /// The listing's path (`?name=` is appended) and its key.
    list: &'static str,
    key: &'static str,
}

impl NovaCloud {
    /// The flavor's id and the CPU and memory it gives a VM, by id or else by name.
    async fn resolve_flavor(
        &self,
        flavor: &str,
        tenant: Option<&TenantToken>,
    ) -> Result<(String, Option<Resources>), CloudError> {
        #[derive(Deserialize)]
        struct One {
            flavor: Flavor,
        }
        let path = format!("/flavors/{}", encode(flavor));
        if let Some(one) = self.get_optional::<One>("compute", &path, tenant).await? {
            return Ok((one.flavor.id.clone(), one.flavor.resources()));
        }
        #[derive(Deserialize)]
        struct Listing {
            flavors: Vec<Flavor>,
        }
        let listing = self.get_listing::<Listing>("compute", "/flavors/detail", tenant).await?;
        let found = listing.flavors.into_iter().find(|f| f.name.as_deref() == Some(flavor));
        found.map(|f| (f.id.clone(), f.resources())).ok_or_else(|| CloudError::Invalid {
            field: "flavor",
            reason: format!("no flavor {flavor:?}"),
        })
    }

    async fn resolve_image(
        &self,
        image: &str,
        tenant: Option<&TenantToken>,
    ) -> Result<String, CloudError> {
        let lookup =
            Lookup { one: "/v2/images/", wrapped: None, list: "/v2/images", key: "images" };
        let candidates: Vec<NamedId> = self.id_or_name("image", image, lookup, tenant).await?;
        let one = the_one(candidates, "image", "image", image)?;
        match one.status.as_deref() {
            Some(status) if status != "active" => Err(CloudError::Invalid {
                field: "image",
                reason: format!("image {image:?} is {status}, not active"),
            }),
            _ => Ok(one.id),
        }
    }

    async fn resolve_network(
        &self,
        network: &str,
        tenant: Option<&TenantToken>,
    ) -> Result<String, CloudError> {
        let lookup = Lookup {
            one: "/v2.0/networks/",
            wrapped: Some("network"),
            list: "/v2.0/networks",
            key: "networks",
        };
        let candidates: Vec<IdOnly> = self.id_or_name("network", network, lookup, tenant).await?;
        Ok(the_one(candidates, "networks", "network", network)?.id)
    }

    /// Drops what checks found for `project` (`None`: the service user's).
    pub(super) fn forget_lookups(&self, project: Option<&str>) {
        let mut lookups = self.lookups.lock().expect("lookups");
        lookups.retain(|key, _| key.project.as_deref() != project);
    }

    /// What `reference` names at `service_type`: the one resource with that id when it is a
    /// UUID (none when there is no such resource), else every resource of that name.
    async fn id_or_name<T: serde::de::DeserializeOwned>(
        &self,
        service_type: &'static str,
        reference: &str,
        lookup: Lookup,
        tenant: Option<&TenantToken>,
    ) -> Result<Vec<T>, CloudError> {
        if uuid::Uuid::parse_str(reference).is_ok() {
            let path = format!("{}{}", lookup.one, encode(reference));
            let one = self.get_optional::<Value>(service_type, &path, tenant).await?;
            let one = match (one, lookup.wrapped) {
                (Some(Value::Object(mut wrapper)), Some(key)) => {
                    Some(wrapper.remove(key).ok_or_else(|| unexpected(service_type, key))?)
                }
                (Some(_), Some(key)) => return Err(unexpected(service_type, key)),
                (one, _) => one,
            };
            let one = one.map(|one| parse_value(service_type, one)).transpose()?;
            return Ok(one.into_iter().collect());
        }
        let path = format!("{}?name={}", lookup.list, encode(reference));
        let mut listing: HashMap<String, Value> =
            self.get_listing(service_type, &path, tenant).await?;
        let listed =
            listing.remove(lookup.key).ok_or_else(|| unexpected(service_type, lookup.key))?;
        parse_value(service_type, listed)
    }

    /// Nova's `networks` for the request.
    async fn networks(
        &self,
        request: &VmRequest,
        tenant: Option<&TenantToken>,
    ) -> Result<Value, CloudError> {
        let names: Vec<&str> = if request.networks.is_empty() {
            match self.config.default_network.as_str() {
                "auto" | "none" => return Ok(json!(self.config.default_network)),
                name => vec![name],
            }
        } else {
            request.networks.iter().map(String::as_str).collect()
        };
        let mut networks = Vec::new();
        for name in names {
            networks.push(json!({ "uuid": self.resolve_network(name, tenant).await? }));
        }
        Ok(Value::Array(networks))
    }

    /// The request's flavor id, image id and `networks`, each checked to exist (and to be the
    /// tenant's to use, as the tenant).
    /// `cached`: whether what an earlier check found may answer (a launch's check); a creation
    /// of a launch stored before its check's findings were kept resolves afresh, and always asks.
    pub(super) async fn resolve(
        &self,
        request: &VmRequest,
        tenant: Option<&TenantToken>,
        cached: bool,
    ) -> Result<Checked, CloudError> {
        let keep = match cached {
            true => Duration::from_secs(self.config.lookup_cache_secs),
            false => Duration::ZERO,
        };
        let key = LookupKey {
            project: tenant.map(|t| t.project_id.clone()),
            flavor: request.flavor.clone(),
            image: request.image.clone(),
            networks: request.networks.clone(),
        };
        if !keep.is_zero() {
            let lookups = self.lookups.lock().expect("lookups");
            if let Some((at, found)) = lookups.get(&key) {
                if at.elapsed() < keep {
                    return Ok(found.clone());
                }
            }
        }
        // Three services, asked at once: a check takes the slowest answer, not their sum. Each
        // is waited for, so the error named is the first part's in this order, whichever failed
        // first.
        let (flavor, image, networks) = tokio::join!(
            self.resolve_flavor(&request.flavor, tenant),
            self.resolve_image(&request.image, tenant),
            self.networks(request, tenant),
        );
        let (flavor, flavor_resources) = flavor?;
        let checked = Checked { flavor, image: image?, networks: networks?, flavor_resources };
        if self.config.lookup_cache_secs > 0 {
            let mut lookups = self.lookups.lock().expect("lookups");
            if lookups.len() >= LOOKUPS_KEPT {
                lookups.retain(|_, (at, _)| at.elapsed() < keep);
                if lookups.len() >= LOOKUPS_KEPT {
                    lookups.clear();
                }
            }
            lookups.insert(key, (Instant::now(), checked.clone()));
        }
        Ok(checked)
    }
}
