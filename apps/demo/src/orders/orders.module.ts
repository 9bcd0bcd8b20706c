import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { Order } from './order.entity.js';
import { OrdersRpcController } from './orders-rpc.controller.js';
import { OrdersController } from './orders.controller.js';
import { OrdersService } from './orders.service.js';

@Module({
  imports: [TypeOrmModule.forFeature([Order])],
  controllers: [OrdersController, OrdersRpcController],
  providers: [OrdersService],
})
export class OrdersModule {}
