#pragma once
#include "emu_runtime.h"
#include "emu_host.h"
