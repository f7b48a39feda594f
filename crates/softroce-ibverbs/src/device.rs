//! Devices: the list of configured addresses (`ibv_get_device_list`) and opening one
//! (`ibv_open_device`).

use crate::{Context, Error, Result};
use softroce::net::UdpDevice;
use std::net::IpAddr;
use std::sync::Arc;

/// `ibv_get_device_list`: the softroce devices configured for this process, one per
/// address in `$SOFTROCE_IP` (default `127.0.0.1`), named `softroce0`, `softroce1`, … in
/// order. Nothing is opened.
///
/// Errors: [`Error::Io`] with `EINVAL` when `$SOFTROCE_IP` holds something that is not an
/// IP address, or no address at all.
///
/// ```
/// // With SOFTROCE_IP unset this is one device on 127.0.0.1.
/// let list = softroce_ibverbs::devices().unwrap();
/// assert!(!list.is_empty());
/// assert!(list[0].name().starts_with("softroce"));
/// ```
pub fn devices() -> Result<DeviceList> {
    softroce::net::discover::devices_from_env()
        .map(DeviceList::from_addrs)
        .map_err(discover_error)
}

/// A [`softroce::net::discover::DiscoverError`] as this API's `EINVAL` I/O error.
fn discover_error(e: softroce::net::discover::DiscoverError) -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        e.to_string(),
    ))
}

impl DeviceList {
    /// The list [`devices`] makes from the text of `$SOFTROCE_IP`: addresses separated by
    /// commas or white space. Errors: as [`devices`].
    ///
    /// ```
    /// let l = softroce_ibverbs::DeviceList::parse("127.0.24.1, 127.0.24.2 ::1").unwrap();
    /// assert_eq!(l.len(), 3);
    /// assert_eq!((l[2].name(), l[2].ip().to_string().as_str()), ("softroce2", "::1"));
    /// assert_eq!(softroce_ibverbs::DeviceList::parse("10.0.0.300").unwrap_err().errno(), 22);
    /// ```
    pub fn parse(text: &str) -> Result<DeviceList> {
        softroce::net::discover::parse_device_list(text)
            .map(DeviceList::from_addrs)
            .map_err(discover_error)
    }

    fn from_addrs(addrs: Vec<softroce::net::discover::DeviceAddr>) -> DeviceList {
        DeviceList {
            devices: addrs
                .into_iter()
                .map(|d| Device {
                    name: d.name,
                    ip: d.ip,
                })
                .collect(),
        }
    }
}

/// The list of devices ([`devices`], [`DeviceList::with_ip`]). Derefs to `[Device]`.
#[derive(Debug, Clone)]
pub struct DeviceList {
    devices: Vec<Device>,
}

impl DeviceList {
    /// One device per address, named `softroce0`, `softroce1`, … in order.
    pub fn with_ip(ips: &[IpAddr]) -> DeviceList {
        DeviceList::from_addrs(softroce::net::discover::device_list(ips))
    }
}

impl core::ops::Deref for DeviceList {
    type Target = [Device];
    fn deref(&self) -> &[Device] {
        &self.devices
    }
}

/// A device that can be opened: a name and the IP address it will own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    name: String,
    ip: IpAddr,
}

impl Device {
    /// The device name (`hca_id`), e.g. `softroce0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address the device binds (UDP port 4791); its GID index 1 names it.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// `ibv_open_device`: joins the device on its address (shared by every process that opens
    /// it, `softroce::net::share`) and starts its driver thread, with the process's default
    /// [`softroce::net::UdpOptions`].
    ///
    /// Errors: [`Error::Io`] with the socket error (`EADDRINUSE` when kernel rxe or a device
    /// opened alone holds the port, `EADDRNOTAVAIL`).
    ///
    /// ```
    /// use softroce_ibverbs::DeviceList;
    /// let list = DeviceList::with_ip(&["127.0.24.103".parse().unwrap()]);
    /// let ctx = list[0].open().unwrap();
    /// assert_eq!(ctx.gid(1).unwrap().to_string(), "::ffff:127.0.24.103");
    /// let pd = ctx.alloc_pd().unwrap();
    /// let mr = pd.register(b"registered bytes").unwrap();
    /// assert_eq!((mr.len(), mr.to_vec()), (16, b"registered bytes".to_vec()));
    /// // A second context of the device (in this process or another) shares it, as rxe0
    /// // is shared: its QPs get numbers of another slot (softroce::net::steer).
    /// let ctx2 = list[0].open().unwrap();
    /// assert_eq!(ctx2.gid(1).unwrap(), ctx.gid(1).unwrap());
    /// ```
    pub fn open(&self) -> Result<Context> {
        let dev = UdpDevice::open(&self.name, self.ip)?;
        Ok(Context { dev: Arc::new(dev) })
    }
}
