//! [`Timer`]: device time between two points of a device's work queue.

use std::time::Instant;

use cudarc::driver::{sys::CUevent_flags, CudaEvent};

use crate::device::{Device, Kind};
use crate::error::driver_error;
use crate::error::Error;

/// Measures the device time of the work submitted between [`Device::timer`] and
/// [`Timer::stop`] (or [`Timer::elapsed_ms`]).
///
/// On a CUDA device it is a pair of CUDA events recorded on the device's stream: the time is
/// the GPU's, from when the stream reached the start to when it reached the end, whatever the
/// host did meanwhile. On the CPU, where kernels run as they are called, it is the host's
/// clock.
///
/// ```
/// use fuse_runtime::Device;
/// let dev = Device::detect();
/// let x = dev.upload(&[1.0f32; 1024])?;
/// let mut timer = dev.timer()?;
/// let y = dev.upload(&x.to_vec()?)?; // the work to time
/// let ms = timer.elapsed_ms()?;
/// assert!(ms >= 0.0 && y.len() == 1024);
/// # Ok::<(), fuse_runtime::Error>(())
/// ```
///
/// To time many launches without waiting after each, keep one timer per launch, [`stop`]
/// each, and read them all at the end:
///
/// ```
/// # use fuse_runtime::Device;
/// # let dev = Device::detect();
/// let mut timers = Vec::new();
/// for _ in 0..3 {
///     let mut timer = dev.timer()?;
///     dev.zeros::<f32>(&[256])?; // the work to time
///     timer.stop()?;
///     timers.push(timer);
/// }
/// let times: Vec<f32> = timers.iter_mut().map(|t| t.elapsed_ms()).collect::<Result<_, _>>()?;
/// assert_eq!(times.len(), 3);
/// # Ok::<(), fuse_runtime::Error>(())
/// ```
///
/// [`stop`]: Timer::stop
pub struct Timer {
    clock: Clock,
}

enum Clock {
    Cpu {
        start: Instant,
        end: Option<Instant>,
    },
    Cuda {
        device: Device,
        start: CudaEvent,
        end: CudaEvent,
        stopped: bool,
    },
}

impl Device {
    /// Starts a [`Timer`]: on a CUDA device, records a start event on the device's stream,
    /// after all work submitted so far; on the CPU, reads the clock.
    ///
    /// Fails with [`Error::Cuda`] when the driver cannot create or record an event.
    pub fn timer(&self) -> Result<Timer, Error> {
        let clock = match self.kind() {
            Kind::Cpu => Clock::Cpu {
                start: Instant::now(),
                end: None,
            },
            Kind::Cuda(queue) => {
                let ctx = queue.stream.context();
                let event = || {
                    ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                        .map_err(|e| driver_error("cuEventCreate", e))
                };
                let (start, end) = (event()?, event()?);
                start
                    .record(&queue.stream)
                    .map_err(|e| driver_error("cuEventRecord", e))?;
                Clock::Cuda {
                    device: self.clone(),
                    start,
                    end,
                    stopped: false,
                }
            }
        };
        Ok(Timer { clock })
    }
}

impl Timer {
    /// Marks the end of the timed work without waiting for it: on a CUDA device, records the
    /// end event after all work submitted so far. Only the first call counts.
    pub fn stop(&mut self) -> Result<(), Error> {
        match &mut self.clock {
            Clock::Cpu { end, .. } => {
                end.get_or_insert_with(Instant::now);
                Ok(())
            }
            Clock::Cuda {
                device,
                end,
                stopped,
                ..
            } => {
                if !*stopped {
                    let queue = device.queue("Timer::stop")?;
                    end.record(&queue.stream)
                        .map_err(|e| driver_error("cuEventRecord", e))?;
                    *stopped = true;
                }
                Ok(())
            }
        }
    }

    /// The milliseconds between the start and the end, stopping the timer first if
    /// [`stop`](Timer::stop) was not called. On a CUDA device this waits until the stream
    /// has reached the end event, and reports any error the timed work raised.
    pub fn elapsed_ms(&mut self) -> Result<f32, Error> {
        self.stop()?;
        match &self.clock {
            Clock::Cpu { start, end } => {
                let end = end.unwrap_or_else(Instant::now);
                Ok((end.duration_since(*start).as_secs_f64() * 1e3) as f32)
            }
            Clock::Cuda { start, end, .. } => start
                .elapsed_ms(end)
                .map_err(|e| driver_error("cuEventElapsedTime", e)),
        }
    }
}

impl std::fmt::Debug for Timer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (device, stopped) = match &self.clock {
            Clock::Cpu { end, .. } => ("CPU".to_string(), end.is_some()),
            Clock::Cuda {
                device, stopped, ..
            } => (device.name(), *stopped),
        };
        write!(f, "Timer(on {device}, stopped: {stopped})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_timer_measures_host_time() {
        let mut timer = Device::cpu().timer().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        timer.stop().unwrap();
        let first = timer.elapsed_ms().unwrap();
        assert!(first >= 5.0, "{first}");
        std::thread::sleep(std::time::Duration::from_millis(2));
        timer.stop().unwrap();
        assert_eq!(
            timer.elapsed_ms().unwrap(),
            first,
            "only the first stop counts"
        );
        assert_eq!(format!("{timer:?}"), "Timer(on CPU, stopped: true)");
    }

    #[test]
    fn elapsed_without_stop_stops() {
        let mut timer = Device::cpu().timer().unwrap();
        assert_eq!(format!("{timer:?}"), "Timer(on CPU, stopped: false)");
        let ms = timer.elapsed_ms().unwrap();
        assert!(ms >= 0.0);
        assert_eq!(timer.elapsed_ms().unwrap(), ms);
    }

    #[test]
    fn timer_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Timer>();
    }
}
