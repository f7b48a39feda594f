//! Net: which softroce devices a process has, from `$SOFTROCE_IP`.
//!
//! A softroce device is an IP address on this host on which the process binds UDP port 4791.
//! Every frontend (the `softroce` command, the `ibverbs`-shaped Rust API, the C libraries)
//! finds its devices here, so that one environment names the same devices for all of them:
//! `SOFTROCE_IP` holds addresses separated by commas or white space, and device `i` of the list
//! is named `softroce<i>`. Without the variable the list is one device on 127.0.0.1. Listing
//! opens nothing.

use std::net::{IpAddr, Ipv4Addr};

/// The environment variable that lists the device addresses.
pub const SOFTROCE_IP: &str = "SOFTROCE_IP";

/// The address of the only device when `$SOFTROCE_IP` is unset.
pub const DEFAULT_DEVICE_IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A device that can be opened: its name (`hca_id`, `softroce<i>`) and the address it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAddr {
    /// `softroce0`, `softroce1`, … in list order.
    pub name: String,
    /// The address whose UDP port 4791 the device binds; GID index 1 names it.
    pub ip: IpAddr,
}

/// Why `$SOFTROCE_IP` (or a list given as text) names no usable device list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoverError {
    /// A word of the list is not an IP address.
    NotAnAddress(String),
    /// The list holds no address at all.
    NoAddress,
}

impl DiscoverError {
    /// The errno a C caller gets: `EINVAL`.
    pub fn errno(&self) -> i32 {
        libc::EINVAL
    }
}

impl core::fmt::Display for DiscoverError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DiscoverError::NotAnAddress(word) => {
                write!(f, "{SOFTROCE_IP}: {word:?} is not an IP address")
            }
            DiscoverError::NoAddress => write!(f, "{SOFTROCE_IP} names no address"),
        }
    }
}

impl std::error::Error for DiscoverError {}

/// One device per address, named `softroce0`, `softroce1`, … in order.
pub fn device_list(ips: &[IpAddr]) -> Vec<DeviceAddr> {
    ips.iter()
        .enumerate()
        .map(|(i, ip)| DeviceAddr {
            name: format!("softroce{i}"),
            ip: *ip,
        })
        .collect()
}

/// The device list that the text of `$SOFTROCE_IP` names: addresses separated by commas or
/// white space. Errors: [`DiscoverError::NotAnAddress`] for the first word that is not an IP
/// address, [`DiscoverError::NoAddress`] for a list with no word.
///
/// ```
/// use softroce::net::discover::parse_device_list;
/// let l = parse_device_list("127.0.24.1, 127.0.24.2 ::1").unwrap();
/// assert_eq!(l.len(), 3);
/// assert_eq!((l[2].name.as_str(), l[2].ip.to_string().as_str()), ("softroce2", "::1"));
/// assert!(parse_device_list("10.0.0.300").is_err());
/// ```
pub fn parse_device_list(text: &str) -> Result<Vec<DeviceAddr>, DiscoverError> {
    let mut ips = Vec::new();
    for word in text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
    {
        let ip = word
            .parse::<IpAddr>()
            .map_err(|_| DiscoverError::NotAnAddress(word.to_string()))?;
        ips.push(ip);
    }
    if ips.is_empty() {
        return Err(DiscoverError::NoAddress);
    }
    Ok(device_list(&ips))
}

/// This process's devices: those `$SOFTROCE_IP` names, or one on [`DEFAULT_DEVICE_IP`] when
/// it is unset. Errors: those of [`parse_device_list`].
pub fn devices_from_env() -> Result<Vec<DeviceAddr>, DiscoverError> {
    match std::env::var(SOFTROCE_IP) {
        Ok(text) => parse_device_list(&text),
        Err(_) => Ok(device_list(&[DEFAULT_DEVICE_IP])),
    }
}

/// The address of the device a single-device tool opens: `explicit` when given, else the
/// first device of [`devices_from_env`]. Errors: those of [`parse_device_list`].
pub fn default_device_ip(explicit: Option<IpAddr>) -> Result<IpAddr, DiscoverError> {
    match explicit {
        Some(ip) => Ok(ip),
        None => devices_from_env().map(|l| l.first().map_or(DEFAULT_DEVICE_IP, |d| d.ip)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_split_on_commas_and_white_space() {
        let l = parse_device_list(" 127.0.0.1,127.0.0.2\t::1\n").unwrap();
        let names: Vec<&str> = l.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["softroce0", "softroce1", "softroce2"]);
        assert_eq!(l[1].ip, IpAddr::from([127, 0, 0, 2]));
    }

    #[test]
    fn bad_lists_name_the_bad_word() {
        assert_eq!(
            parse_device_list("127.0.0.1, bogus")
                .unwrap_err()
                .to_string(),
            "SOFTROCE_IP: \"bogus\" is not an IP address"
        );
        assert_eq!(
            parse_device_list(" , ").unwrap_err(),
            DiscoverError::NoAddress
        );
        assert_eq!(DiscoverError::NoAddress.errno(), libc::EINVAL);
    }

    #[test]
    fn an_explicit_address_wins() {
        let ip = IpAddr::from([127, 0, 0, 9]);
        assert_eq!(default_device_ip(Some(ip)), Ok(ip));
    }
}
